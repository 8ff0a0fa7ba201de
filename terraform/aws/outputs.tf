output "driver_command" {
  description = "The exact `elasticd run` command line the driver runs (as the systemd unit elasticd-driver.service), each argument quoted for sh."
  value       = module.job.driver_command
}

output "driver_private_ip" {
  description = "Private IPv4 address of the driver; the agents dial it on TCP 29400."
  value       = aws_instance.driver.private_ip
}

output "driver_public_ip" {
  description = "Public IPv4 address of the driver, with driver_public_ip = true (ssh, and the tunnel to the live page); empty otherwise."
  value       = aws_instance.driver.public_ip
}

output "release_object" {
  description = "With elasticd_release_path: the S3 URI of the uploaded release (s3://bucket/key); null otherwise."
  value       = local.release_upload ? "s3://${aws_s3_object.release[0].bucket}/${aws_s3_object.release[0].key}" : null
}

output "driver_instance_id" {
  description = "Instance ID of the driver."
  value       = aws_instance.driver.id
}

output "autoscaling_group_name" {
  description = "Name of the spot GPU Auto Scaling group (--asg)."
  value       = aws_autoscaling_group.gpu.name
}

output "fallback_autoscaling_group_name" {
  description = "With on_demand_fallback: name of the on-demand fallback Auto Scaling group (--fallback-asg), at zero until spot runs out; null otherwise."
  value       = var.on_demand_fallback ? aws_autoscaling_group.fallback[0].name : null
}

output "sqs_queue_url" {
  description = "URL of the notice queue the EventBridge rules feed (--sqs-queue-url)."
  value       = aws_sqs_queue.notices.url
}

output "driver_role_arn" {
  description = "ARN of the driver's IAM role."
  value       = aws_iam_role.driver.arn
}

output "security_group_ids" {
  description = "Security groups of the driver and of the GPU instances."
  value = {
    driver = aws_security_group.driver.id
    gpu    = aws_security_group.gpu.id
  }
}

output "agent_secret" {
  description = "The secret shared by the driver and the agents (also in the state and in the instances' user data)."
  value       = local.agent_secret
  sensitive   = true
}
