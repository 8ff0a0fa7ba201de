# An elastic training cluster on Compute Engine: an on-demand driver VM running `elasticd run`,
# and a managed instance group (zonal or regional) of SPOT GPU VMs running `elasticd agent`.

locals {
  mig_name    = "${var.name}-gpu"
  regional    = var.mig_zone == null
  driver_port = 29400
  driver_tag  = "${var.name}-driver"
  gpu_tag     = "${var.name}-gpu"

  agent_secret = var.agent_secret != null ? var.agent_secret : random_password.agent_secret[0].result

  location_args = local.regional ? ["--region", var.region] : ["--zone", var.mig_zone]

  driver_args = concat([
    "/usr/local/bin/elasticd", "run",
    "--provider", "gcp",
    "--project", var.project,
    local.location_args[0], local.location_args[1],
    "--mig", local.mig_name,
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
  ], var.training_command)

  # Each argument in single quotes, for sh.
  driver_command = join(" ", [for a in local.driver_args : "'${replace(a, "'", "'\\''")}'"])

  install_script = templatefile("${path.module}/templates/install-elasticd.sh.tftpl", {
    url    = var.elasticd_release_url
    sha256 = var.elasticd_release_sha256 == null ? "" : var.elasticd_release_sha256
  })

  labels = merge(var.labels, { elasticd-cluster = var.name })
}

resource "random_password" "agent_secret" {
  count = var.agent_secret == null ? 1 : 0

  length  = 48
  special = false
}

# --- The driver's identity: exactly the calls providers/gcp makes ---

resource "google_service_account" "driver" {
  project      = var.project
  account_id   = "${var.name}-driver"
  display_name = "elasticd driver of ${var.name}"
}

# Kept equal to the SDK calls of providers/gcp by terraform/permissions_test.go.
resource "google_project_iam_custom_role" "driver" {
  project     = var.project
  role_id     = "elasticd_${replace(var.name, "-", "_")}_driver"
  title       = "elasticd driver (${var.name})"
  description = "Lists the managed instances of the elasticd GPU group and their VMs."
  permissions = ["compute.instanceGroupManagers.get", "compute.instances.list"]
}

resource "google_project_iam_member" "driver" {
  project = var.project
  role    = google_project_iam_custom_role.driver.name
  member  = "serviceAccount:${google_service_account.driver.email}"
}

# The GPU VMs call no Google API: their service account has no role.
resource "google_service_account" "gpu" {
  project      = var.project
  account_id   = "${var.name}-gpu"
  display_name = "elasticd GPU VMs of ${var.name} (no roles)"
}

# --- Firewall: the driver's port and the workers' mesh, inside the network only ---

resource "google_compute_firewall" "driver_from_gpu" {
  project     = var.project
  name        = "${var.name}-driver-from-gpu"
  network     = var.network
  description = "elasticd agents and workers to the driver"
  direction   = "INGRESS"
  source_tags = [local.gpu_tag]
  target_tags = [local.driver_tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(local.driver_port)]
  }
}

resource "google_compute_firewall" "gpu_mesh" {
  project     = var.project
  name        = "${var.name}-gpu-mesh"
  network     = var.network
  description = "workers to workers (allreduce on ephemeral ports)"
  direction   = "INGRESS"
  source_tags = [local.gpu_tag]
  target_tags = [local.gpu_tag]

  allow {
    protocol = "tcp"
  }
}

resource "google_compute_firewall" "driver_ssh" {
  count = var.ssh_cidr == null ? 0 : 1

  project       = var.project
  name          = "${var.name}-driver-ssh"
  network       = var.network
  description   = "ssh to the driver"
  direction     = "INGRESS"
  source_ranges = [var.ssh_cidr]
  target_tags   = [local.driver_tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# --- The driver VM ---

resource "google_compute_instance" "driver" {
  project      = var.project
  zone         = var.driver_zone
  name         = "${var.name}-driver"
  machine_type = var.driver_machine_type
  tags         = [local.driver_tag]
  labels       = local.labels

  boot_disk {
    initialize_params {
      image = var.driver_image
      size  = 20
    }
  }

  network_interface {
    subnetwork = var.subnetwork

    dynamic "access_config" {
      for_each = var.driver_public_ip ? [1] : []

      content {}
    }
  }

  metadata = {
    user-data = templatefile("${path.module}/templates/driver.yaml.tftpl", {
      name           = var.name
      agent_secret   = local.agent_secret
      install_script = local.install_script
      command_line   = local.driver_command
      environment    = {}
    })
  }

  service_account {
    email  = google_service_account.driver.email
    scopes = ["cloud-platform"]
  }

  lifecycle {
    precondition {
      condition     = var.min_np <= var.np && var.np <= var.max_np
      error_message = "Need min_np <= np <= max_np."
    }
  }

  # The role must be bound before elasticd's first poll, or that poll is refused.
  depends_on = [google_project_iam_member.driver]
}

# --- The SPOT GPU group ---

resource "google_compute_instance_template" "gpu" {
  project      = var.project
  name_prefix  = "${var.name}-gpu-"
  machine_type = var.gpu_machine_type
  tags         = [local.gpu_tag]
  labels       = local.labels

  disk {
    source_image = var.gpu_image
    disk_size_gb = var.gpu_disk_size_gb
    boot         = true
    auto_delete  = true
  }

  network_interface {
    subnetwork = var.subnetwork
  }

  dynamic "guest_accelerator" {
    for_each = var.gpu_accelerator_type == null ? [] : [var.gpu_accelerator_type]

    content {
      type  = guest_accelerator.value
      count = var.gpu_accelerator_count
    }
  }

  scheduling {
    provisioning_model          = "SPOT"
    preemptible                 = true
    automatic_restart           = false
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = "DELETE"
  }

  metadata = {
    user-data = templatefile("${path.module}/templates/agent.yaml.tftpl", {
      name           = var.name
      agent_secret   = local.agent_secret
      install_script = local.install_script
      setup_commands = var.worker_setup_commands
      driver_ip      = google_compute_instance.driver.network_interface[0].network_ip
      driver_port    = local.driver_port
      metadata       = "gcp"
    })
  }

  service_account {
    email  = google_service_account.gpu.email
    scopes = ["cloud-platform"]
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_instance_group_manager" "gpu" {
  count = local.regional ? 0 : 1

  project            = var.project
  zone               = var.mig_zone
  name               = local.mig_name
  base_instance_name = local.mig_name
  target_size        = var.target_size

  version {
    instance_template = google_compute_instance_template.gpu.self_link_unique
  }

  lifecycle {
    ignore_changes = [target_size]
  }
}

resource "google_compute_region_instance_group_manager" "gpu" {
  count = local.regional ? 1 : 0

  project                   = var.project
  region                    = var.region
  name                      = local.mig_name
  base_instance_name        = local.mig_name
  target_size               = var.target_size
  distribution_policy_zones = length(var.distribution_zones) > 0 ? var.distribution_zones : null

  version {
    instance_template = google_compute_instance_template.gpu.self_link_unique
  }

  lifecycle {
    ignore_changes = [target_size]
  }
}
