output "driver_command" {
  description = "The exact `elasticd run` command line the driver runs (as the systemd unit elasticd-driver.service), each argument quoted for sh."
  value       = module.job.driver_command
}

output "driver_private_ip" {
  description = "Internal IPv4 address of the driver; the agents dial it on TCP 29400."
  value       = google_compute_instance.driver.network_interface[0].network_ip
}

output "driver_public_ip" {
  description = "External IPv4 address of the driver, with driver_public_ip = true (ssh, and the tunnel to the live page); null otherwise."
  value       = var.driver_public_ip ? google_compute_instance.driver.network_interface[0].access_config[0].nat_ip : null
}

output "release_object" {
  description = "With elasticd_release_path: the Cloud Storage URI of the uploaded release (gs://bucket/object); null otherwise."
  value       = local.release_upload ? "gs://${google_storage_bucket.release[0].name}/${google_storage_bucket_object.release[0].name}" : null
}

output "mig_name" {
  description = "Name of the SPOT GPU managed instance group (--mig)."
  value       = local.mig_name
}

output "mig_self_link" {
  description = "Self link of the managed instance group, zonal or regional."
  value       = local.regional ? google_compute_region_instance_group_manager.gpu[0].self_link : google_compute_instance_group_manager.gpu[0].self_link
}

output "driver_service_account" {
  description = "Email of the driver's service account, which holds the custom discovery role."
  value       = google_service_account.driver.email
}

output "agent_secret" {
  description = "The secret shared by the driver and the agents (also in the state and in the VMs' metadata)."
  value       = local.agent_secret
  sensitive   = true
}
