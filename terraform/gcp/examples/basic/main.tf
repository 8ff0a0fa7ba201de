# A small GCP cluster: a regional MIG of 4 SPOT g2-standard-4 VMs (one L4 each).
#
#   terraform init && terraform apply -var-file=example.tfvars

provider "google" {
  project = var.project
  region  = var.region
}

module "cluster" {
  source = "../.."

  name                 = "demo"
  project              = var.project
  region               = var.region
  driver_zone          = "${var.region}-a"
  network              = var.network
  subnetwork           = var.subnetwork
  gpu_machine_type     = "g2-standard-4"
  gpu_image            = var.gpu_image
  target_size          = 4
  np                   = 4
  min_np               = 2
  max_np               = 8
  training_command     = ["python3", "/opt/train/train.py", "--epochs", "10"]
  elasticd_release_url = var.elasticd_release_url
}
