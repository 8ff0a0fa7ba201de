# What every cloud's cluster runs, rendered once: the driver's `elasticd run` command line, the
# cloud-init of the driver (elasticd-driver.service) and of the GPU hosts
# (elasticd-agent.service), and the script that installs elasticd on both. It creates nothing;
# each cloud module (terraform/aws, gcp, azure, ibm) keeps its own resources and passes the
# cloud-specific parts in: the provider flags, the driver's environment, the driver's address.

locals {
  driver_port = 29400

  # The driver's command line, argument by argument; elasticd reads the same flags from
  # ELASTICD_* variables, but a command line in one place is easier to check and to copy.
  driver_args = concat(
    ["/usr/local/bin/elasticd", "run"],
    var.provider_args,
    [
      "--launcher", "agent",
      "--listen", "0.0.0.0:${local.driver_port}",
      "--agent-secret-file", "/etc/elasticd/agent-secret",
      # A driver that crashes is started again by systemd and takes the job up: the agents
      # keep the workers training meanwhile.
      "--state-dir", "/var/lib/elasticd/state",
      "-np", tostring(var.np),
      "--min-np", tostring(var.min_np),
      "--max-np", tostring(var.max_np),
      "--",
    ],
    var.training_command,
  )

  # Each argument in single quotes, for sh.
  driver_command = join(" ", [for a in local.driver_args : "'${replace(a, "'", "'\\''")}'"])

  install_script = templatefile("${path.module}/templates/install-elasticd.sh.tftpl", {
    url    = var.elasticd_release_url
    sha256 = var.elasticd_release_sha256 == null ? "" : var.elasticd_release_sha256
  })
}
