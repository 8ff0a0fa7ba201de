output "driver_command" {
  description = "The elasticd run command line of the driver."
  value       = module.cluster.driver_command
}

output "vmss_name" {
  description = "The Spot GPU scale set."
  value       = module.cluster.vmss_name
}
