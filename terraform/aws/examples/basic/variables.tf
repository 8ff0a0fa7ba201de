variable "name" {
  description = "Name of the cluster: prefixes its resources. A second cluster (a second job) in the same account needs another."
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

variable "driver_flags" {
  description = "More flags of elasticd run, e.g. [\"--reset-limit\", \"5\"]."
  type        = list(string)
  default     = []
}

variable "driver_files" {
  description = "Files those flags need on the driver, path -> content (under /etc/elasticd/ or /var/lib/elasticd/)."
  type        = map(string)
  default     = {}
}

variable "driver_public_ip" {
  description = "Whether the driver gets a public IP, for ssh (and a tunnel to the live page) from ssh_cidr."
  type        = bool
  default     = false
}

variable "ssh_cidr" {
  description = "CIDR block allowed to ssh to the driver; null: none."
  type        = string
  default     = null
}

variable "live_page_cidrs" {
  description = "CIDR blocks allowed to open the driver's live page on TCP 29400 (unauthenticated, read-only); default none."
  type        = list(string)
  default     = []
}

variable "key_name" {
  description = "EC2 key pair for ssh to the driver; null: none."
  type        = string
  default     = null
}

variable "driver_subnet_id" {
  description = "Subnet of the driver; null: the first of private_subnet_ids. A public subnet with driver_public_ip = true lets you ssh to it."
  type        = string
  default     = null
}

variable "on_demand_fallback" {
  description = "Whether to create an on-demand group at zero that the job falls back on while spot is out (<name>-gpu-ondemand); needs \"--manage-capacity\" in driver_flags."
  type        = bool
  default     = false
}
