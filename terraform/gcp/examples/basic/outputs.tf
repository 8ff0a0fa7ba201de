output "driver_command" {
  description = "The elasticd run command line of the driver."
  value       = module.cluster.driver_command
}

output "mig_name" {
  description = "The SPOT GPU managed instance group."
  value       = module.cluster.mig_name
}

output "driver_private_ip" {
  description = "Private IP of the driver (the live page is on its TCP 29400)."
  value       = module.cluster.driver_private_ip
}

output "driver_public_ip" {
  description = "Public IP of the driver, with driver_public_ip = true (ssh and the tunnel to the live page)."
  value       = module.cluster.driver_public_ip
}

output "release_object" {
  description = "Where the module uploaded elasticd_release_path; null with a URL."
  value       = module.cluster.release_object
}
