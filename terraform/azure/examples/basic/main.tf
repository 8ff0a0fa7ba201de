# A small Azure cluster: a scale set of 4 Spot Standard_NC4as_T4_v3 VMs (one T4 each).
#
#   terraform init && terraform apply -var-file=example.tfvars

provider "azurerm" {
  features {}
  subscription_id = var.subscription_id
}

module "cluster" {
  source = "../.."

  name                    = var.name
  resource_group_name     = var.resource_group_name
  location                = var.location
  subnet_id               = var.subnet_id
  ssh_public_key          = var.ssh_public_key
  gpu_vm_size             = "Standard_NC4as_T4_v3"
  gpu_image               = var.gpu_image
  gpu_instances           = 4
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
