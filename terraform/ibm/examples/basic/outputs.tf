output "driver_command" {
  description = "The elasticd run command line of the driver."
  value       = module.cluster.driver_command
}

output "instance_group_id" {
  description = "The spot GPU instance group."
  value       = module.cluster.instance_group_id
}

output "driver_private_ip" {
  description = "Private IP of the driver (the live page is on its TCP 29400)."
  value       = module.cluster.driver_private_ip
}

output "driver_floating_ip" {
  description = "Public IP of the driver, with driver_public_ip = true (ssh and the tunnel to the live page)."
  value       = module.cluster.driver_floating_ip
}
