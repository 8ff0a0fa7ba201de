variable "name" {
  description = "Name of the cluster: prefixes its resources. A second cluster (a second job) in the same account needs another."
  type        = string
  default     = "demo"
}

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
