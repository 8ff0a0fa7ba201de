# A small AWS cluster: 2 to 8 spot g5/g6 instances, one worker per GPU, training a demo script.
#
#   terraform init && terraform apply -var-file=example.tfvars

provider "aws" {
  region = var.region
}

module "cluster" {
  source = "../.."

  name                    = var.name
  region                  = var.region
  vpc_id                  = var.vpc_id
  driver_subnet_id        = coalesce(var.driver_subnet_id, var.private_subnet_ids[0])
  gpu_subnet_ids          = var.private_subnet_ids
  driver_ami_id           = var.driver_ami_id
  gpu_ami_id              = var.gpu_ami_id
  gpu_instance_types      = ["g5.xlarge", "g6.xlarge"]
  min_size                = 0
  max_size                = 8
  desired_capacity        = 4
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
  key_name                = var.key_name

  # An on-demand group at zero that the job falls back on while spot is out; needs
  # "--manage-capacity" in driver_flags (see ../spot-with-fallback).
  on_demand_fallback = var.on_demand_fallback
}
