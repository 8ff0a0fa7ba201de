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

  # A release given as a local file (elasticd_release_path) is uploaded to Cloud Storage and read
  # by the VMs with their service accounts; one given as a URL is fetched as it is.
  release_upload = var.elasticd_release_path != null
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
  driver_flags            = var.driver_flags
  driver_files            = var.driver_files
  elasticd_release_url    = var.elasticd_release_url
  elasticd_release_path   = var.elasticd_release_path
  elasticd_release_sha256 = var.elasticd_release_sha256
  elasticd_release_object = local.release_upload ? {
    fetch = "gcs"
    url   = "https://storage.googleapis.com/storage/v1/b/${google_storage_bucket.release[0].name}/o/${urlencode(google_storage_bucket_object.release[0].name)}?alt=media"
  } : null
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

# Only with --manage-capacity in driver_flags: resize the group and recreate one of its VMs
# (update), read the operations that returns (zonal or regional, as the group is), and read an
# autoscaler attached to the group, which the driver refuses to fight. A role of its own, so
# that a driver that does not steer its group cannot change it. Bound on the project like the
# role above: a managed instance group has no IAM policy of its own to bind it on.
resource "google_project_iam_custom_role" "capacity" {
  count = module.job.manage_capacity ? 1 : 0

  project     = var.project
  role_id     = "elasticd_${replace(var.name, "-", "_")}_capacity"
  title       = "elasticd capacity (${var.name})"
  description = "Sets the size of the elasticd GPU group and recreates its broken VMs."
  permissions = [
    "compute.instanceGroupManagers.update",
    "compute.zoneOperations.get",
    "compute.regionOperations.get",
    "compute.autoscalers.get",
  ]
}

resource "google_project_iam_member" "capacity" {
  count = module.job.manage_capacity ? 1 : 0

  project = var.project
  role    = google_project_iam_custom_role.capacity[0].name
  member  = "serviceAccount:${google_service_account.driver.email}"
}

# The GPU VMs call no Google API: their service account has no role (but may read the release
# uploaded from elasticd_release_path, below).
resource "google_service_account" "gpu" {
  project      = var.project
  account_id   = "${var.name}-gpu"
  display_name = "elasticd GPU VMs of ${var.name} (no roles)"
}

# --- The release from elasticd_release_path: a Cloud Storage object, read by the VMs ---

# The VMs fetch it with curl and their service account's token from the metadata server
# (modules/elasticd-job/templates/install-elasticd.sh.tftpl). The bucket holds only the release.
resource "random_id" "release" {
  count = local.release_upload ? 1 : 0

  byte_length = 4
}

resource "google_storage_bucket" "release" {
  count = local.release_upload ? 1 : 0

  project                     = var.project
  name                        = "elasticd-${var.name}-${random_id.release[0].hex}"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  labels                      = local.labels
}

resource "google_storage_bucket_object" "release" {
  count = local.release_upload ? 1 : 0

  bucket = google_storage_bucket.release[0].name
  name   = "releases/${basename(var.elasticd_release_path)}"
  source = var.elasticd_release_path
}

# Kept to storage.objects.get on the release's bucket by terraform/release_test.go:
# legacyObjectReader is that one permission (objectViewer would add objects.list).
resource "google_storage_bucket_iam_member" "release" {
  for_each = local.release_upload ? {
    driver = google_service_account.driver.email
    gpu    = google_service_account.gpu.email
  } : {}

  bucket = google_storage_bucket.release[0].name
  role   = "roles/storage.legacyObjectReader"
  member = "serviceAccount:${each.value}"
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

# The live page, /v1/status and /metrics from live_page_cidrs: none by default.
resource "google_compute_firewall" "driver_live_page" {
  count = length(var.live_page_cidrs) > 0 ? 1 : 0

  project       = var.project
  name          = "${var.name}-driver-live-page"
  network       = var.network
  description   = "the driver's live page (read-only, unauthenticated)"
  direction     = "INGRESS"
  source_ranges = var.live_page_cidrs
  target_tags   = [local.driver_tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(local.driver_port)]
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

  # The role must be bound before elasticd's first poll, or that poll is refused; the
  # release's reader before its download.
  depends_on = [google_project_iam_member.driver, google_project_iam_member.capacity, google_storage_bucket_iam_member.release]
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

  # The group's size is the driver's once the group exists (with --manage-capacity it sets it,
  # to 0 when the job ends): an apply must not put target_size back.
  lifecycle {
    ignore_changes = [target_size]
  }

  # The GPU service account may read the release before the first VM fetches it.
  depends_on = [google_storage_bucket_iam_member.release]
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

  # The group's size is the driver's once the group exists (with --manage-capacity it sets it,
  # to 0 when the job ends): an apply must not put target_size back.
  lifecycle {
    ignore_changes = [target_size]
  }

  # The GPU service account may read the release before the first VM fetches it.
  depends_on = [google_storage_bucket_iam_member.release]
}
