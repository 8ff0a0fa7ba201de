variable "name" {
  description = "Name of the cluster: prefixes its resources. A second cluster (a second job) in the same account needs another."
  type        = string
  default     = "demo"
}

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
