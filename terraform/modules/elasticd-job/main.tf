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
    # The on-demand group the job falls back on while spot is out, when the cloud module made one.
    var.fallback_args,
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
    ],
    # The job's other flags (validated: none of the above), then the command.
    var.driver_flags,
    ["--"],
    var.training_command,
  )

  # Whether the driver steers its group's size (--manage-capacity, or =true as urfave/cli reads
  # it): the cloud modules grant the calls that needs only then.
  manage_capacity = anytrue([for f in var.driver_flags : can(regex("^--?manage-capacity(=(1|t|T|true|TRUE|True))?$", f))])

  # Each argument in single quotes, for sh.
  driver_command = join(" ", [for a in local.driver_args : "'${replace(a, "'", "'\\''")}'"])

  # The release: an https URL fetched as it is, or the file at elasticd_release_path, which the
  # cloud module uploaded (elasticd_release_object) and each host fetches with its own identity.
  # A local file's checksum is always checked: it is computed here.
  release = var.elasticd_release_object != null ? var.elasticd_release_object : {
    fetch = "https", url = var.elasticd_release_url == null ? "" : var.elasticd_release_url, region = "", client_id = ""
  }
  release_sha256 = (var.elasticd_release_path != null ? filesha256(var.elasticd_release_path)
  : var.elasticd_release_sha256 != null ? var.elasticd_release_sha256 : "")

  install_script = templatefile("${path.module}/templates/install-elasticd.sh.tftpl", {
    url       = local.release.url
    sha256    = local.release_sha256
    fetch     = local.release.fetch
    region    = local.release.region
    client_id = local.release.client_id
  })
}
