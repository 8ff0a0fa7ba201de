# A small GCP cluster: a regional MIG of 4 SPOT g2-standard-4 VMs (one L4 each).
#
#   terraform init && terraform apply -var-file=example.tfvars

provider "google" {
  project = var.project
  region  = var.region
}

module "cluster" {
  source = "../.."

  name                    = var.name
  project                 = var.project
  region                  = var.region
  driver_zone             = "${var.region}-a"
  network                 = var.network
  subnetwork              = var.subnetwork
  gpu_machine_type        = "g2-standard-4"
  gpu_image               = var.gpu_image
  target_size             = 4
  np                      = 4
  min_np                  = 2
  max_np                  = 8
  training_command        = var.training_command
  driver_flags            = var.driver_flags
  driver_files            = var.driver_files
  elasticd_release_url    = var.elasticd_release_url
  elasticd_release_path   = var.elasticd_release_path
  elasticd_release_sha256 = var.elasticd_release_sha256
  driver_public_ip        = var.driver_public_ip
  ssh_cidr                = var.ssh_cidr
  live_page_cidrs         = var.live_page_cidrs
}
