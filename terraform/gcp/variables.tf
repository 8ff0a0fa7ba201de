variable "name" {
  description = "Name of the cluster: prefixes every resource (the managed instance group is <name>-gpu)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,20}[a-z0-9]$", var.name))
    error_message = "name must be 2 to 22 characters of lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "project" {
  description = "ID of the Google Cloud project (--project)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project ID such as my-project-123."
  }
}

variable "region" {
  description = "Region of the cluster; a regional managed instance group spreads over its zones (--region)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must be a region name such as us-central1."
  }
}

variable "mig_zone" {
  description = "Zone of a zonal managed instance group (--zone). Null (the default): a regional group over distribution_zones, or the region's zones."
  type        = string
  default     = null

  validation {
    condition     = var.mig_zone == null || can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", var.mig_zone))
    error_message = "mig_zone must be a zone name such as us-central1-a, or null."
  }
}

variable "distribution_zones" {
  description = "Zones of a regional group (mig_zone null); empty: every zone of the region that has the machine type."
  type        = list(string)
  default     = []
}

variable "driver_zone" {
  description = "Zone of the driver VM."
  type        = string

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", var.driver_zone))
    error_message = "driver_zone must be a zone name such as us-central1-a."
  }
}

variable "network" {
  description = "Self link or name of the VPC network; the firewall rules are added to it."
  type        = string
}

variable "subnetwork" {
  description = "Self link of the subnetwork of the driver and the GPU VMs, in region. The VMs have no external IP (except the driver with driver_public_ip): give the subnetwork Cloud NAT to download elasticd."
  type        = string
}

variable "driver_public_ip" {
  description = "Whether the driver gets an ephemeral external IP (for ssh from ssh_cidr, or when the subnetwork has no Cloud NAT)."
  type        = bool
  default     = false
}

variable "driver_machine_type" {
  description = "Machine type of the on-demand driver VM; it only coordinates."
  type        = string
  default     = "e2-standard-2"
}

variable "driver_image" {
  description = "Boot image of the driver: a Linux image with cloud-init and systemd, e.g. ubuntu-os-cloud/ubuntu-2404-lts-amd64."
  type        = string
  default     = "ubuntu-os-cloud/ubuntu-2404-lts-amd64"
}

variable "gpu_machine_type" {
  description = "Machine type of the spot GPU VMs, e.g. g2-standard-4 (1 L4) or a2-highgpu-1g (1 A100), whose GPUs are built in; for N1 types also set gpu_accelerator_type."
  type        = string
  default     = "g2-standard-4"
}

variable "gpu_accelerator_type" {
  description = "Accelerator to attach to each GPU VM, for machine types without built-in GPUs (N1), e.g. nvidia-tesla-t4; null: none."
  type        = string
  default     = null
}

variable "gpu_accelerator_count" {
  description = "Accelerators per GPU VM when gpu_accelerator_type is set."
  type        = number
  default     = 1

  validation {
    condition     = contains([1, 2, 4, 8], var.gpu_accelerator_count)
    error_message = "gpu_accelerator_count must be 1, 2, 4 or 8."
  }
}

variable "gpu_image" {
  description = "Boot image of the GPU VMs: NVIDIA driver, cloud-init, systemd and the training program's runtime (e.g. a Deep Learning VM image)."
  type        = string
}

variable "gpu_disk_size_gb" {
  description = "Boot disk size of each GPU VM, in GB."
  type        = number
  default     = 200

  validation {
    condition     = var.gpu_disk_size_gb >= 10 && var.gpu_disk_size_gb <= 65536
    error_message = "gpu_disk_size_gb must be between 10 and 65536."
  }
}

variable "target_size" {
  description = "GPU VMs the managed instance group keeps. Later changes made outside Terraform (an autoscaler, gcloud) are left alone."
  type        = number

  validation {
    condition     = var.target_size >= 0 && var.target_size <= 1000 && floor(var.target_size) == var.target_size
    error_message = "target_size must be a whole number between 0 and 1000."
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
  description = "Local path of a tarball built by `make release` (dist/elasticd-VERSION-linux-amd64.tar.gz): uploaded to a Cloud Storage bucket of its own, read by the VMs' service accounts (storage.objects.get on that bucket only, roles/storage.legacyObjectReader), checked against its SHA-256. Give this or elasticd_release_url."
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

variable "labels" {
  description = "Labels added to every resource that takes them."
  type        = map(string)
  default     = {}
}
