# A small IBM Cloud cluster: an instance group of 4 spot gx3-16x80x1l4 instances (one L4 each).
#
#   export IC_API_KEY=...   # for Terraform itself
#   terraform init && terraform apply -var-file=example.tfvars

provider "ibm" {
  region = var.region
}

module "cluster" {
  source = "../.."

  name                    = var.name
  region                  = var.region
  resource_group_id       = var.resource_group_id
  vpc_id                  = var.vpc_id
  driver_zone             = "${var.region}-1"
  driver_subnet_id        = var.subnet_id
  gpu_zone                = "${var.region}-1"
  gpu_subnet_ids          = [var.subnet_id]
  ssh_key_ids             = var.ssh_key_ids
  driver_image_id         = var.driver_image_id
  gpu_image_id            = var.gpu_image_id
  gpu_instances           = 4
  np                      = 4
  min_np                  = 2
  max_np                  = 8
  training_command        = var.training_command
  driver_flags            = var.driver_flags
  driver_files            = var.driver_files
  elasticd_release_url    = var.elasticd_release_url
  elasticd_release_sha256 = var.elasticd_release_sha256
  driver_public_ip        = var.driver_public_ip
  ssh_cidr                = var.ssh_cidr
  live_page_cidrs         = var.live_page_cidrs
}
