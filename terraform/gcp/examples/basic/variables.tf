variable "project" {
  description = "Google Cloud project ID."
  type        = string
}

variable "region" {
  description = "Region of the cluster."
  type        = string
  default     = "us-central1"
}

variable "network" {
  description = "VPC network name or self link."
  type        = string
}

variable "subnetwork" {
  description = "Subnetwork self link, in region, with Cloud NAT."
  type        = string
}

variable "gpu_image" {
  description = "Boot image of the GPU VMs (a Deep Learning VM image with the training code)."
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
