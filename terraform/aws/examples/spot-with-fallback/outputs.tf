output "driver_command" {
  description = "The elasticd run command line of the driver (with --manage-capacity, --fallback-asg and --fallback-after)."
  value       = module.cluster.driver_command
}

output "autoscaling_group_name" {
  description = "The spot GPU Auto Scaling group."
  value       = module.cluster.autoscaling_group_name
}

output "fallback_autoscaling_group_name" {
  description = "The on-demand fallback Auto Scaling group, at zero until spot runs out."
  value       = module.cluster.fallback_autoscaling_group_name
}

output "driver_private_ip" {
  description = "Private IP of the driver (the live page is on its TCP 29400)."
  value       = module.cluster.driver_private_ip
}
