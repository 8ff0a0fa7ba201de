# The basic cluster with an on-demand fallback group: 2 to 8 spot g5/g6 instances, and a
# second, on-demand group of the same instance types at zero, which the driver grows by the
# hosts missing while spot is out and sets back to zero when spot returns.
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
  elasticd_release_url    = var.elasticd_release_url
  elasticd_release_path   = var.elasticd_release_path
  elasticd_release_sha256 = var.elasticd_release_sha256
  key_name                = var.key_name

  # The fallback group, at zero, and what the driver needs to steer it: --manage-capacity
  # (without it the plan fails). At most fallback_max_size on-demand hosts at a time.
  on_demand_fallback = true
  fallback_after     = var.fallback_after
  fallback_max_size  = 4
  driver_flags       = concat(["--manage-capacity"], var.driver_flags)
  driver_files       = var.driver_files
}
