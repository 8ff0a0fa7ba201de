variable "region" {
  description = "IBM Cloud region of the VPC."
  type        = string
  default     = "us-south"
}

variable "resource_group_id" {
  description = "Resource group of the cluster."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string
}

variable "subnet_id" {
  description = "Subnet in zone <region>-1 with a public gateway, for the driver and the GPU instances."
  type        = string
}

variable "ssh_key_ids" {
  description = "VPC SSH key IDs installed on the instances."
  type        = list(string)
}

variable "driver_image_id" {
  description = "Image of the driver (an Ubuntu stock image)."
  type        = string
}

variable "gpu_image_id" {
  description = "Image of the GPU instances (NVIDIA driver and the training code)."
  type        = string
}

variable "elasticd_release_url" {
  description = "HTTPS URL of the elasticd release (a .tar.gz with an elasticd binary, or the binary)."
  type        = string

  validation {
    condition     = startswith(var.elasticd_release_url, "https://")
    error_message = "elasticd_release_url must start with https://."
  }
}
