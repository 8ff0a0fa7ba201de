variable "name" {
  description = "Name of the cluster: prefixes every resource (the instance group is <name>-gpu)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}[a-z0-9]$", var.name))
    error_message = "name must be 2 to 32 characters of lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "region" {
  description = "IBM Cloud region of the VPC, e.g. us-south (--region). The provider configuration of the calling module must use the same region."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}-[a-z]+$", var.region))
    error_message = "region must be a region name such as us-south or eu-de."
  }
}

variable "resource_group_id" {
  description = "ID of the resource group of every resource of the cluster; the driver's trusted profile is granted access in it only."
  type        = string
}

variable "vpc_id" {
  description = "ID of the VPC."
  type        = string
}

variable "driver_subnet_id" {
  description = "Subnet of the driver instance. It needs a public gateway (or driver_public_ip) to download elasticd."
  type        = string
}

variable "gpu_subnet_ids" {
  description = "Subnets of the GPU instance group, one per zone it may use; the first one's zone is the instance template's. They need a public gateway to download elasticd."
  type        = list(string)

  validation {
    condition     = length(var.gpu_subnet_ids) > 0
    error_message = "gpu_subnet_ids must list at least one subnet ID."
  }
}

variable "driver_zone" {
  description = "Zone of the driver instance (of driver_subnet_id), e.g. us-south-1."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}-[a-z]+-[0-9]$", var.driver_zone))
    error_message = "driver_zone must be a zone name such as us-south-1."
  }
}

variable "gpu_zone" {
  description = "Zone of the instance template (of the first of gpu_subnet_ids), e.g. us-south-1."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}-[a-z]+-[0-9]$", var.gpu_zone))
    error_message = "gpu_zone must be a zone name such as us-south-1."
  }
}

variable "driver_public_ip" {
  description = "Whether the driver gets a floating IP (for ssh from ssh_cidr, or when its subnet has no public gateway)."
  type        = bool
  default     = false
}

variable "ssh_key_ids" {
  description = "IDs of the VPC SSH keys installed on every instance (IBM Cloud requires at least one)."
  type        = list(string)

  validation {
    condition     = length(var.ssh_key_ids) > 0
    error_message = "ssh_key_ids must list at least one key ID."
  }
}

variable "driver_profile" {
  description = "Profile of the standard (not spot) driver instance; it only coordinates."
  type        = string
  default     = "cx2-2x4"
}

variable "driver_image_id" {
  description = "Image ID of the driver: a Linux image with cloud-init and systemd (an Ubuntu stock image)."
  type        = string
}

variable "gpu_profile" {
  description = "GPU profile of the spot instances, e.g. gx3-16x80x1l4 (1 L4) or gx2-8x64x1v100 (1 V100)."
  type        = string
  default     = "gx3-16x80x1l4"
}

variable "gpu_image_id" {
  description = "Image ID of the GPU instances: NVIDIA driver, cloud-init, systemd and the training program's runtime."
  type        = string
}

variable "gpu_instances" {
  description = "GPU instances the instance group keeps (its membership count). Later changes made outside Terraform (an instance group manager, the console) are left alone."
  type        = number

  validation {
    condition     = var.gpu_instances >= 0 && var.gpu_instances <= 1000 && floor(var.gpu_instances) == var.gpu_instances
    error_message = "gpu_instances must be a whole number between 0 and 1000."
  }
}

variable "spot" {
  description = "Whether the GPU instances are spot instances (availability class spot, deleted on preemption); false: standard."
  type        = bool
  default     = true
}

variable "credentials" {
  description = "How the driver authenticates to the VPC API: trusted_profile (the default: an IAM trusted profile linked to the driver instance, no key on disk) or api_key (driver_api_key, which lands in the state and the instance's user data)."
  type        = string
  default     = "trusted_profile"

  validation {
    condition     = contains(["trusted_profile", "api_key"], var.credentials)
    error_message = "credentials must be trusted_profile or api_key."
  }
}

variable "driver_api_key" {
  description = "IAM API key for the driver when credentials is api_key; it needs the Viewer role on VPC Infrastructure Services (instance groups and instances), and Editor on both with --manage-capacity in driver_flags. Null otherwise."
  type        = string
  default     = null
  sensitive   = true
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
  description = "HTTPS URL of the elasticd release to install: a .tar.gz holding an elasticd binary, or the binary itself. Required: this module does not upload a local tarball (no elasticd_release_path), so put the one from `make release` where the instances can fetch it over https."
  type        = string
}

variable "elasticd_release_sha256" {
  description = "SHA-256 of the release (its line in dist/SHA256SUMS); when set, cloud-init refuses a download that does not match. Null: not checked with elasticd_release_url."
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
  description = "IPv4 CIDR blocks allowed to reach the driver's TCP 29400 for the live page, /v1/status and /metrics, which are read-only and unauthenticated; the same port carries the agents' and workers' (authenticated) protocol. Empty (the default): only the GPU instances reach it; use an ssh tunnel instead."
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
  description = "User tags added to every resource that takes them."
  type        = list(string)
  default     = []
}
