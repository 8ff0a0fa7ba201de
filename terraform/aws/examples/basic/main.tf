# A small AWS cluster: 2 to 8 spot g5/g6 instances, one worker per GPU, training a demo script.
#
#   terraform init && terraform apply -var-file=example.tfvars

provider "aws" {
  region = var.region
}

module "cluster" {
  source = "../.."

  name                 = "demo"
  region               = var.region
  vpc_id               = var.vpc_id
  driver_subnet_id     = var.private_subnet_ids[0]
  gpu_subnet_ids       = var.private_subnet_ids
  driver_ami_id        = var.driver_ami_id
  gpu_ami_id           = var.gpu_ami_id
  gpu_instance_types   = ["g5.xlarge", "g6.xlarge"]
  min_size             = 0
  max_size             = 8
  desired_capacity     = 4
  np                   = 4
  min_np               = 2
  max_np               = 8
  training_command     = ["python3", "/opt/train/train.py", "--epochs", "10"]
  elasticd_release_url = var.elasticd_release_url
}
