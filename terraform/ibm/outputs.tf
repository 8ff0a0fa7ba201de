output "driver_command" {
  description = "The exact `elasticd run` command line the driver runs (as the systemd unit elasticd-driver.service), each argument quoted for sh."
  value       = module.job.driver_command
}

output "driver_private_ip" {
  description = "Private IPv4 address of the driver; the agents dial it on TCP 29400."
  value       = ibm_is_instance.driver.primary_network_interface[0].primary_ip[0].address
}

output "driver_floating_ip" {
  description = "Floating IP of the driver when driver_public_ip is set; else null."
  value       = var.driver_public_ip ? ibm_is_floating_ip.driver[0].address : null
}

output "instance_group_id" {
  description = "ID of the GPU instance group (--instance-group takes its name or ID)."
  value       = ibm_is_instance_group.gpu.id
}

output "instance_group_name" {
  description = "Name of the GPU instance group."
  value       = ibm_is_instance_group.gpu.name
}

output "trusted_profile_id" {
  description = "ID of the driver's trusted profile; null with credentials = api_key."
  value       = local.profile ? ibm_iam_trusted_profile.driver[0].id : null
}

output "agent_secret" {
  description = "The secret shared by the driver and the agents (also in the state and in the instances' user data)."
  value       = local.agent_secret
  sensitive   = true
}
