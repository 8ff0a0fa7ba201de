# An elastic training cluster on Compute Engine: an on-demand driver VM running `elasticd run`,
# and a managed instance group (zonal or regional) of SPOT GPU VMs running `elasticd agent`.

locals {
  mig_name    = "${var.name}-gpu"
  regional    = var.mig_zone == null
  driver_port = module.job.driver_port
  driver_tag  = "${var.name}-driver"
  gpu_tag     = "${var.name}-gpu"

  agent_secret = var.agent_secret != null ? var.agent_secret : random_password.agent_secret[0].result

  location_args = local.regional ? ["--region", var.region] : ["--zone", var.mig_zone]

  labels = merge(var.labels, { elasticd-cluster = var.name })
}

# The job (np, the training command, the release) and what the hosts run, validated and rendered
# by the module every cloud shares; this module passes what is its own: the provider's flags,
# the driver's environment and address, the metadata service the agents watch.
module "job" {
  source = "../modules/elasticd-job"

  name = var.name
  provider_args = [
    "--provider", "gcp",
    "--project", var.project,
    local.location_args[0], local.location_args[1],
    "--mig", local.mig_name,
  ]
  driver_ip               = google_compute_instance.driver.network_interface[0].network_ip
  agent_metadata          = "gcp"
  agent_secret            = local.agent_secret
  np                      = var.np
  min_np                  = var.min_np
  max_np                  = var.max_np
  training_command        = var.training_command
  worker_setup_commands   = var.worker_setup_commands
  elasticd_release_url    = var.elasticd_release_url
  elasticd_release_sha256 = var.elasticd_release_sha256
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
    user-data = module.job.driver_user_data
  }

  service_account {
    email  = google_service_account.driver.email
    scopes = ["cloud-platform"]
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
    user-data = module.job.agent_user_data
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
