output "driver_command" {
  description = "The elasticd run command line of the driver."
  value       = module.cluster.driver_command
}

output "autoscaling_group_name" {
  description = "The spot GPU Auto Scaling group."
  value       = module.cluster.autoscaling_group_name
}
