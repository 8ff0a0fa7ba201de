variable "name" {
  description = "Name of the cluster: prefixes its resources (the groups are <name>-gpu and <name>-gpu-ondemand)."
  type        = string
  default     = "demo"
}

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
  description = "Private subnets with a NAT gateway, one per availability zone; the driver goes in the first. Both groups use them all."
  type        = list(string)
}

variable "driver_subnet_id" {
  description = "Subnet of the driver; null: the first of private_subnet_ids."
  type        = string
  default     = null
}

variable "driver_ami_id" {
  description = "AMI of the driver (Amazon Linux 2023 or Ubuntu)."
  type        = string
}

variable "gpu_ami_id" {
  description = "AMI of the GPU instances, spot and on-demand (an AWS Deep Learning AMI with the training code)."
  type        = string
}

variable "elasticd_release_url" {
  description = "HTTPS URL of the elasticd release (a .tar.gz with an elasticd binary, or the binary); or give elasticd_release_path."
  type        = string
  default     = null

  validation {
    condition     = var.elasticd_release_url == null || startswith(coalesce(var.elasticd_release_url, "-"), "https://")
    error_message = "elasticd_release_url must start with https://."
  }
}

variable "elasticd_release_path" {
  description = "Path of a tarball from make release (dist/elasticd-VERSION-linux-amd64.tar.gz), uploaded by the module; or give elasticd_release_url."
  type        = string
  default     = null
}

variable "elasticd_release_sha256" {
  description = "SHA-256 of the release: its line of dist/SHA256SUMS. Null: not checked with a URL, computed with a path."
  type        = string
  default     = null
}

variable "training_command" {
  description = "The training program and its arguments, run once per GPU (what follows -- on the driver's command line)."
  type        = list(string)
  default     = ["python3", "/opt/train/train.py", "--epochs", "10"]
}

variable "fallback_after" {
  description = "How long the job must have been short of np slots on spot, with spot launches failing for capacity, before the fallback group grows."
  type        = string
  default     = "10m"
}

variable "driver_flags" {
  description = "More flags of elasticd run, after --manage-capacity, e.g. [\"--prices\", \"/etc/elasticd/prices.yaml\"]."
  type        = list(string)
  default     = []
}

variable "driver_files" {
  description = "Files those flags need on the driver, path -> content (under /etc/elasticd/ or /var/lib/elasticd/)."
  type        = map(string)
  default     = {}
}

variable "key_name" {
  description = "EC2 key pair for ssh to the driver and the GPU instances; null: none."
  type        = string
  default     = null
}
