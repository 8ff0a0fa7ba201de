output "driver_port" {
  description = "TCP port the driver listens on for the agents and the workers (--listen); the cloud modules open it from the GPU hosts to the driver."
  value       = local.driver_port
}

output "driver_args" {
  description = "The driver's `elasticd run` command line, argument by argument."
  value       = local.driver_args
}

output "manage_capacity" {
  description = "Whether driver_flags turns on --manage-capacity: the driver then sets its group's size and replaces broken hosts, and the cloud module grants it the calls for that (only then)."
  value       = local.manage_capacity
}

output "driver_command" {
  description = "The exact `elasticd run` command line the driver runs (as the systemd unit elasticd-driver.service), each argument quoted for sh."
  value       = local.driver_command
}

output "driver_user_data" {
  description = "cloud-config of the driver: installs elasticd, writes the secret and the environment, and enables elasticd-driver.service. Plain text: base64-encode it where the cloud wants that."
  value = templatefile("${path.module}/templates/driver.yaml.tftpl", {
    name           = var.name
    agent_secret   = var.agent_secret
    install_script = local.install_script
    command_line   = local.driver_command
    environment    = var.driver_environment
    files          = var.driver_files
  })
  sensitive = true

  precondition {
    condition     = var.min_np <= var.np && var.np <= var.max_np
    error_message = "Need min_np <= np <= max_np."
  }

  # elasticd refuses a fallback group without --manage-capacity at start; the plan says so first.
  precondition {
    condition     = length(var.fallback_args) == 0 || local.manage_capacity
    error_message = "An on-demand fallback group (on_demand_fallback) needs \"--manage-capacity\" in driver_flags: only a driver that steers capacity grows it while spot is out and sets it back to zero, and the module grants the calls for that only then."
  }

  precondition {
    condition     = (var.elasticd_release_url == null) != (var.elasticd_release_path == null)
    error_message = "Set exactly one of elasticd_release_url (an https:// URL of a release) and elasticd_release_path (a tarball from make release, which the module uploads)."
  }

  precondition {
    condition     = (var.elasticd_release_path == null) == (var.elasticd_release_object == null)
    error_message = "elasticd_release_path is uploaded by the cloud module, which passes where as elasticd_release_object; this module got one without the other."
  }

  precondition {
    condition     = var.elasticd_release_path == null || var.elasticd_release_sha256 == null || var.elasticd_release_sha256 == local.release_sha256
    error_message = "elasticd_release_sha256 does not match the file at elasticd_release_path: compare with dist/SHA256SUMS, or leave it null (it is computed from the file)."
  }
}

output "agent_user_data" {
  description = "cloud-config of a GPU host: installs elasticd, runs worker_setup_commands, checks the host once (elasticd agent --check, logged to /var/log/elasticd-agent-check.log), and enables elasticd-agent.service dialling the driver. Plain text: base64-encode it where the cloud wants that."
  value = templatefile("${path.module}/templates/agent.yaml.tftpl", {
    name           = var.name
    agent_secret   = var.agent_secret
    install_script = local.install_script
    setup_commands = var.worker_setup_commands
    # The agent's flags, for its unit and for the check before its first start.
    agent_flags = "--driver http://${var.driver_ip}:${local.driver_port} --agent-secret-file /etc/elasticd/agent-secret --metadata ${var.agent_metadata}"
  })
  sensitive = true
}
