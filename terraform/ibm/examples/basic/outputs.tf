output "driver_command" {
  description = "The elasticd run command line of the driver."
  value       = module.cluster.driver_command
}

output "instance_group_id" {
  description = "The spot GPU instance group."
  value       = module.cluster.instance_group_id
}
