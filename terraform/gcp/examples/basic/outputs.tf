output "driver_command" {
  description = "The elasticd run command line of the driver."
  value       = module.cluster.driver_command
}

output "mig_name" {
  description = "The SPOT GPU managed instance group."
  value       = module.cluster.mig_name
}
