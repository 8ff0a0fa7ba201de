output "driver_command" {
  description = "The exact `elasticd run` command line the driver runs (as the systemd unit elasticd-driver.service), each argument quoted for sh."
  value       = module.job.driver_command
}

output "driver_private_ip" {
  description = "Private IPv4 address of the driver; the agents dial it on TCP 29400."
  value       = azurerm_network_interface.driver.private_ip_address
}

output "driver_public_ip" {
  description = "Public IP of the driver, when driver_public_ip is set; else null."
  value       = var.driver_public_ip ? azurerm_public_ip.driver[0].ip_address : null
}

output "release_object" {
  description = "With elasticd_release_path: the URL of the uploaded release blob; null otherwise."
  value       = local.release_upload ? azurerm_storage_blob.release[0].url : null
}

output "vmss_name" {
  description = "Name of the Spot GPU scale set (--vmss)."
  value       = azurerm_linux_virtual_machine_scale_set.gpu.name
}

output "vmss_id" {
  description = "Resource ID of the scale set, the scope of the driver's role."
  value       = azurerm_linux_virtual_machine_scale_set.gpu.id
}

output "driver_identity_principal_id" {
  description = "Principal ID of the driver's user-assigned managed identity."
  value       = azurerm_user_assigned_identity.driver.principal_id
}

output "agent_secret" {
  description = "The secret shared by the driver and the agents (also in the state and in the VMs' custom data)."
  value       = local.agent_secret
  sensitive   = true
}
