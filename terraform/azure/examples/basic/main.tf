# A small Azure cluster: a scale set of 4 Spot Standard_NC4as_T4_v3 VMs (one T4 each).
#
#   terraform init && terraform apply -var-file=example.tfvars

provider "azurerm" {
  features {}
  subscription_id = var.subscription_id
}

module "cluster" {
  source = "../.."

  name                 = "demo"
  resource_group_name  = var.resource_group_name
  location             = var.location
  subnet_id            = var.subnet_id
  ssh_public_key       = var.ssh_public_key
  gpu_vm_size          = "Standard_NC4as_T4_v3"
  gpu_image            = var.gpu_image
  gpu_instances        = 4
  np                   = 4
  min_np               = 2
  max_np               = 8
  training_command     = ["python3", "/opt/train/train.py", "--epochs", "10"]
  elasticd_release_url = var.elasticd_release_url
}
