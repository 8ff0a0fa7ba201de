variable "region" {
  description = "AWS region of the cluster."
  type        = string
  default     = "us-east-1"
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets with a NAT gateway, one per availability zone; the driver goes in the first."
  type        = list(string)
}

variable "driver_ami_id" {
  description = "AMI of the driver (Amazon Linux 2023 or Ubuntu)."
  type        = string
}

variable "gpu_ami_id" {
  description = "AMI of the GPU instances (an AWS Deep Learning AMI with the training code)."
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
