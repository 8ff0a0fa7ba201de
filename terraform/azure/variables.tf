variable "name" {
  description = "Name of the cluster: prefixes every resource (the scale set is <name>-gpu)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}[a-z0-9]$", var.name))
    error_message = "name must be 2 to 32 characters of lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "resource_group_name" {
  description = "Existing resource group that receives every resource of the cluster (--resource-group)."
  type        = string

  validation {
    condition     = can(regex("^[-\\w._()]{1,90}$", var.resource_group_name))
    error_message = "resource_group_name must be 1 to 90 letters, digits, and - _ . ( )."
  }
}

variable "location" {
  description = "Azure region of the cluster, e.g. eastus."
  type        = string
}

variable "subnet_id" {
  description = "ID of the subnet of the driver and the GPU VMs. They have no public IP (except the driver with driver_public_ip): the subnet needs outbound access (NAT gateway) to download elasticd."
  type        = string

  validation {
    condition     = can(regex("(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.Network/virtualNetworks/[^/]+/subnets/[^/]+$", var.subnet_id))
    error_message = "subnet_id must be a subnet's resource ID."
  }
}

variable "driver_public_ip" {
  description = "Whether the driver gets a public IP (for ssh from ssh_cidr, or when the subnet has no NAT gateway)."
  type        = bool
  default     = false
}

variable "admin_username" {
  description = "Administrator user of the driver and the GPU VMs."
  type        = string
  default     = "elasticd"
}

variable "ssh_public_key" {
  description = "OpenSSH public key of admin_username on every VM (password login is off)."
  type        = string
}

variable "driver_vm_size" {
  description = "Size of the on-demand driver VM; it only coordinates."
  type        = string
  default     = "Standard_D2s_v5"
}

variable "driver_image" {
  description = "Marketplace image of the driver: a Linux image with cloud-init and systemd."
  type = object({
    publisher = string
    offer     = string
    sku       = string
    version   = string
  })
  default = {
    publisher = "Canonical"
    offer     = "ubuntu-24_04-lts"
    sku       = "server"
    version   = "latest"
  }
}

variable "gpu_vm_size" {
  description = "Size of the spot GPU VMs, e.g. Standard_NC4as_T4_v3 (1 T4) or Standard_NC24ads_A100_v4 (1 A100)."
  type        = string
  default     = "Standard_NC4as_T4_v3"
}

variable "gpu_image" {
  description = "Marketplace image of the GPU VMs: NVIDIA driver, cloud-init, systemd and the training program's runtime (e.g. microsoft-dsvm/ubuntu-hpc)."
  type = object({
    publisher = string
    offer     = string
    sku       = string
    version   = string
  })
}

variable "gpu_instances" {
  description = "GPU VMs the scale set starts with. Later changes made outside Terraform (autoscale, the portal) are left alone."
  type        = number

  validation {
    condition     = var.gpu_instances >= 0 && var.gpu_instances <= 1000 && floor(var.gpu_instances) == var.gpu_instances
    error_message = "gpu_instances must be a whole number between 0 and 1000."
  }
}

variable "gpu_zones" {
  description = "Availability zones of the scale set, e.g. [\"1\", \"2\", \"3\"]; empty: regional (no zone)."
  type        = list(string)
  default     = []
}

variable "eviction_policy" {
  description = "What Azure does to an evicted spot VM: Delete (the default; the scale set replaces it) or Deallocate (it stays, stopped, and keeps its disk)."
  type        = string
  default     = "Delete"

  validation {
    condition     = contains(["Delete", "Deallocate"], var.eviction_policy)
    error_message = "eviction_policy must be Delete or Deallocate."
  }
}

variable "max_bid_price" {
  description = "Highest price per hour, in US dollars, paid for a spot VM; -1 (the default): up to the on-demand price, never evicted for price."
  type        = number
  default     = -1

  validation {
    condition     = var.max_bid_price == -1 || var.max_bid_price > 0
    error_message = "max_bid_price must be -1 or a positive price."
  }
}

# The job's settings, np to agent_secret: passed to ../modules/elasticd-job (agent_secret, when
# null, as the generated one), which validates them for every cloud.

variable "np" {
  description = "Workers the job starts with (elasticd run -np)."
  type        = number
}

variable "min_np" {
  description = "Fewest workers the job keeps training with (--min-np); at most np."
  type        = number
}

variable "max_np" {
  description = "Most workers the job grows to (--max-np); at least np."
  type        = number
}

variable "training_command" {
  description = "The training program and its arguments, run once per slot on the GPU instances (what follows -- on the elasticd run command line). It must already be on the GPU image or be installed by worker_setup_commands."
  type        = list(string)
}

variable "worker_setup_commands" {
  description = "Shell commands each GPU instance runs at first boot, after installing elasticd and before starting the agent (fetch the training code, say)."
  type        = list(string)
  default     = []
}

variable "driver_flags" {
  description = "More flags of `elasticd run` for the driver, one argument per element, before -- (e.g. [\"--reset-limit\", \"5\", \"--prices\", \"/etc/elasticd/prices.yaml\"]); not the ones the module sets (--provider and its flags, --launcher, --listen, --agent-secret-file, --state-dir, -np, --min-np, --max-np, --)."
  type        = list(string)
  default     = []
}

variable "driver_files" {
  description = "Files the driver's flags need, path -> content, written by cloud-init (root, 0600) under /etc/elasticd/ or /var/lib/elasticd/ before elasticd starts (a price file for --prices, an admin secret for --admin-secret-file)."
  type        = map(string)
  default     = {}
}

variable "elasticd_release_url" {
  description = "HTTPS URL of the elasticd release to install: a .tar.gz holding an elasticd binary, or the binary itself. Give this or elasticd_release_path."
  type        = string
  default     = null
}

variable "elasticd_release_path" {
  description = "Local path of a tarball built by `make release` (dist/elasticd-VERSION-linux-amd64.tar.gz): uploaded to a storage container of its own, read by a managed identity of the driver and the scale set (Storage Blob Data Reader on that container only), checked against its SHA-256. Give this or elasticd_release_url."
  type        = string
  default     = null
}

variable "elasticd_release_sha256" {
  description = "SHA-256 of the release (its line in dist/SHA256SUMS); when set, cloud-init refuses a download that does not match. Null: not checked with elasticd_release_url, computed from the file with elasticd_release_path."
  type        = string
  default     = null
}

variable "agent_secret" {
  description = "Shared secret of the driver and the agents (32 characters or more). Null (the default): a random one is generated. Either way it is stored in the Terraform state and in the instances' user data; pass one from a secrets manager to control its lifetime."
  type        = string
  default     = null
  sensitive   = true
}

variable "live_page_cidrs" {
  description = "IPv4 CIDR blocks allowed to reach the driver's TCP 29400 for the live page, /v1/status and /metrics, which are read-only and unauthenticated; the same port carries the agents' and workers' (authenticated) protocol. Empty (the default): only the GPU VMs reach it; use an ssh tunnel instead."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.live_page_cidrs : can(cidrhost(c, 0)) && !endswith(c, "/0")])
    error_message = "live_page_cidrs must list IPv4 CIDR blocks such as 203.0.113.0/24, none of them /0 (the whole internet)."
  }
}

variable "ssh_cidr" {
  description = "CIDR block allowed to reach the driver on TCP 22; null (the default) opens no port to anything outside the cluster."
  type        = string
  default     = null

  validation {
    condition     = var.ssh_cidr == null || can(cidrhost(var.ssh_cidr, 0))
    error_message = "ssh_cidr must be an IPv4 CIDR block such as 203.0.113.0/24, or null."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes them."
  type        = map(string)
  default     = {}
}
