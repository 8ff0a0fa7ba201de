variable "subscription_id" {
  description = "Azure subscription of the cluster."
  type        = string
}

variable "resource_group_name" {
  description = "Existing resource group of the cluster."
  type        = string
}

variable "location" {
  description = "Azure region of the cluster."
  type        = string
  default     = "eastus"
}

variable "subnet_id" {
  description = "Subnet resource ID, with a NAT gateway."
  type        = string
}

variable "ssh_public_key" {
  description = "OpenSSH public key of the VMs' admin user."
  type        = string
}

variable "gpu_image" {
  description = "Marketplace image of the GPU VMs."
  type = object({
    publisher = string
    offer     = string
    sku       = string
    version   = string
  })
  default = {
    publisher = "microsoft-dsvm"
    offer     = "ubuntu-hpc"
    sku       = "2204"
    version   = "latest"
  }
}

variable "elasticd_release_url" {
  description = "HTTPS URL of the elasticd release (a .tar.gz with an elasticd binary, or the binary)."
  type        = string

  validation {
    condition     = startswith(var.elasticd_release_url, "https://")
    error_message = "elasticd_release_url must start with https://."
  }
}
