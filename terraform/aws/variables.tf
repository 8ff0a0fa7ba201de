variable "name" {
  description = "Name of the cluster: prefixes every resource (the Auto Scaling group is <name>-gpu, the queue <name>-notices)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,30}[a-z0-9]$", var.name))
    error_message = "name must be 2 to 32 characters of lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "region" {
  description = "AWS region of the cluster. The provider configuration of the calling module must use the same region; it is passed to `elasticd run --region`."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z0-9]+)+-[0-9]+$", var.region))
    error_message = "region must be a region name such as us-east-1."
  }
}

variable "vpc_id" {
  description = "ID of the VPC the driver and the GPU instances run in."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC ID such as vpc-0123456789abcdef0."
  }
}

variable "driver_subnet_id" {
  description = "Subnet of the driver instance. It needs a route to the internet (NAT gateway, or a public IP with driver_public_ip) to download elasticd and reach the AWS APIs."
  type        = string

  validation {
    condition     = can(regex("^subnet-[0-9a-f]+$", var.driver_subnet_id))
    error_message = "driver_subnet_id must be a subnet ID such as subnet-0123456789abcdef0."
  }
}

variable "gpu_subnet_ids" {
  description = "Subnets of the GPU Auto Scaling group, ideally one per availability zone to widen the spot pools. They need a route to the internet (NAT gateway) to download elasticd."
  type        = list(string)

  validation {
    condition     = length(var.gpu_subnet_ids) > 0 && alltrue([for s in var.gpu_subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "gpu_subnet_ids must list at least one subnet ID such as subnet-0123456789abcdef0."
  }
}

variable "driver_public_ip" {
  description = "Whether the driver gets a public IPv4 address (for ssh from ssh_cidr, or when its subnet has no NAT gateway)."
  type        = bool
  default     = false
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

variable "live_page_cidrs" {
  description = "IPv4 CIDR blocks allowed to reach the driver's TCP 29400 for the live page, /v1/status and /metrics, which are read-only and unauthenticated; the same port carries the agents' and workers' (authenticated) protocol. Empty (the default): only the GPU instances reach it; use an ssh tunnel instead."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.live_page_cidrs : can(cidrhost(c, 0)) && !endswith(c, "/0")])
    error_message = "live_page_cidrs must list IPv4 CIDR blocks such as 203.0.113.0/24, none of them /0 (the whole internet)."
  }
}

variable "key_name" {
  description = "Name of an EC2 key pair for ssh to the driver and the GPU instances; null: none."
  type        = string
  default     = null
}

variable "driver_ami_id" {
  description = "AMI of the driver instance: a Linux image with cloud-init and systemd (Amazon Linux 2023, Ubuntu)."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]+$", var.driver_ami_id))
    error_message = "driver_ami_id must be an AMI ID such as ami-0123456789abcdef0."
  }
}

variable "driver_instance_type" {
  description = "Instance type of the on-demand driver; it only coordinates, so a small CPU type is enough."
  type        = string
  default     = "t3.medium"
}

variable "gpu_ami_id" {
  description = "AMI of the GPU instances: NVIDIA driver, cloud-init, systemd and the training program's runtime (for example an AWS Deep Learning AMI)."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]+$", var.gpu_ami_id))
    error_message = "gpu_ami_id must be an AMI ID such as ami-0123456789abcdef0."
  }
}

variable "gpu_instance_types" {
  description = "Instance types the spot group may launch, most preferred first. Give types with the same GPU count, or pass --slots-per-host yourself: slots come from each type's GPU count."
  type        = list(string)
  default     = ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"]

  validation {
    condition     = length(var.gpu_instance_types) > 0 && alltrue([for t in var.gpu_instance_types : can(regex("^[a-z0-9-]+\\.[a-z0-9-]+$", t))])
    error_message = "gpu_instance_types must list at least one instance type such as g5.xlarge."
  }
}

variable "spot_allocation_strategy" {
  description = "How the group picks spot pools: price-capacity-optimized (the default), capacity-optimized, capacity-optimized-prioritized or lowest-price."
  type        = string
  default     = "price-capacity-optimized"

  validation {
    condition     = contains(["price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized", "lowest-price"], var.spot_allocation_strategy)
    error_message = "spot_allocation_strategy must be price-capacity-optimized, capacity-optimized, capacity-optimized-prioritized or lowest-price."
  }
}

variable "min_size" {
  description = "Fewest GPU instances in the group, when it is created. Later changes made outside Terraform (the driver lowers it with --manage-capacity) are left alone."
  type        = number
  default     = 0

  validation {
    condition     = var.min_size >= 0 && floor(var.min_size) == var.min_size
    error_message = "min_size must be a whole number, 0 or more."
  }
}

variable "max_size" {
  description = "Most GPU instances in the group."
  type        = number

  validation {
    condition     = var.max_size >= 1 && var.max_size <= 1000 && floor(var.max_size) == var.max_size
    error_message = "max_size must be a whole number between 1 and 1000."
  }
}

variable "desired_capacity" {
  description = "GPU instances to start with, between min_size and max_size. Later changes made outside Terraform (scaling policies, the console) are left alone."
  type        = number

  validation {
    condition     = var.desired_capacity >= 0 && floor(var.desired_capacity) == var.desired_capacity
    error_message = "desired_capacity must be a whole number, 0 or more."
  }
}

variable "lifecycle_hook_timeout" {
  description = "Seconds a scaled-in GPU instance waits in Terminating:Wait for elasticd to move its workers off (the terminate lifecycle hook's heartbeat timeout)."
  type        = number
  default     = 300

  validation {
    condition     = var.lifecycle_hook_timeout >= 30 && var.lifecycle_hook_timeout <= 7200
    error_message = "lifecycle_hook_timeout must be between 30 and 7200 seconds."
  }
}

variable "on_demand_fallback" {
  description = "Whether to create an on-demand Auto Scaling group (<name>-gpu-ondemand) that the job falls back on while spot capacity is out: same launch template, instance types and subnets as the spot group, at zero until the driver grows it (--fallback-asg). Needs \"--manage-capacity\" in driver_flags (the plan fails without it); the driver is then granted the calls that steer it, on that group only."
  type        = bool
  default     = false
}

variable "fallback_after" {
  description = "With on_demand_fallback: how long the job must have had fewer than np slots on spot, with the spot group's launches failing for capacity, before the fallback group grows (--fallback-after), as a Go duration such as 10m or 1h30m."
  type        = string
  default     = "10m"

  validation {
    condition     = can(regex("^([0-9]+(h|m|s))+$", var.fallback_after)) && can(regex("[1-9]", var.fallback_after))
    error_message = "fallback_after must be a positive duration of hours, minutes and seconds, such as 10m, 90s or 1h30m."
  }
}

variable "fallback_max_size" {
  description = "With on_demand_fallback: most instances in the fallback group, a cap on the on-demand hosts the driver may start. Null (the default): max_size."
  type        = number
  default     = null

  validation {
    condition     = var.fallback_max_size == null || try(var.fallback_max_size >= 1 && var.fallback_max_size <= 1000 && floor(var.fallback_max_size) == var.fallback_max_size, false)
    error_message = "fallback_max_size must be a whole number between 1 and 1000, or null (max_size)."
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
  description = "The training program and its arguments, run once per slot on the GPU instances (what follows -- on the elasticd run command line). It must already be on the GPU AMI or be installed by worker_setup_commands."
  type        = list(string)
}

variable "worker_setup_commands" {
  description = "Shell commands each GPU instance runs at first boot, after installing elasticd and before starting the agent (fetch the training code, say)."
  type        = list(string)
  default     = []
}

variable "driver_flags" {
  description = "More flags of `elasticd run` for the driver, one argument per element, before -- (e.g. [\"--reset-limit\", \"5\", \"--prices\", \"/etc/elasticd/prices.yaml\"]); not the ones the module sets (--provider and its flags, --fallback-asg and --fallback-after: on_demand_fallback and fallback_after, --launcher, --listen, --agent-secret-file, --state-dir, -np, --min-np, --max-np, --)."
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
  description = "Local path of a tarball built by `make release` (dist/elasticd-VERSION-linux-amd64.tar.gz): uploaded to an S3 bucket of its own, read by the instances' roles (s3:GetObject on that object only), checked against its SHA-256. Give this or elasticd_release_url."
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

variable "tags" {
  description = "Tags added to every resource that takes them."
  type        = map(string)
  default     = {}
}
