# The job's settings, validated here once for every cloud. The cloud modules declare the same
# inputs (Terraform makes each module declare what its callers pass), without validation, and
# pass them through unchanged; terraform/shared_test.go keeps it that way.

variable "name" {
  description = "Name of the cluster, in the systemd units' descriptions and the cloud-config comments. Each cloud module validates it against its own naming rules."
  type        = string
}

variable "provider_args" {
  description = "The cloud's flags of `elasticd run`, starting with --provider: which provider and which group (e.g. [\"--provider\", \"aws\", \"--asg\", \"demo-gpu\", ...])."
  type        = list(string)

  validation {
    condition     = length(var.provider_args) >= 2 && var.provider_args[0] == "--provider"
    error_message = "provider_args must start with --provider and the provider's name."
  }
}

variable "np" {
  description = "Workers the job starts with (elasticd run -np)."
  type        = number

  validation {
    condition     = var.np >= 1 && floor(var.np) == var.np
    error_message = "np must be a whole number, 1 or more."
  }
}

variable "min_np" {
  description = "Fewest workers the job keeps training with (--min-np); at most np."
  type        = number

  validation {
    condition     = var.min_np >= 1 && floor(var.min_np) == var.min_np
    error_message = "min_np must be a whole number, 1 or more."
  }
}

variable "max_np" {
  description = "Most workers the job grows to (--max-np); at least np."
  type        = number

  validation {
    condition     = var.max_np >= 1 && floor(var.max_np) == var.max_np
    error_message = "max_np must be a whole number, 1 or more."
  }
}

variable "training_command" {
  description = "The training program and its arguments, run once per slot on the GPU hosts (what follows -- on the elasticd run command line)."
  type        = list(string)

  validation {
    condition     = length(var.training_command) > 0 && var.training_command[0] != ""
    error_message = "training_command must name a program, e.g. [\"python3\", \"/opt/train/train.py\"]."
  }
}

variable "worker_setup_commands" {
  description = "Shell commands each GPU host runs at first boot, after installing elasticd and before starting the agent."
  type        = list(string)
  default     = []
}

variable "elasticd_release_url" {
  description = "HTTPS URL of the elasticd release to install: a .tar.gz holding an elasticd binary, or the binary itself."
  type        = string

  validation {
    condition     = can(regex("^https://[^[:space:]'\"]+$", var.elasticd_release_url))
    error_message = "elasticd_release_url must be an https:// URL without spaces or quotes."
  }
}

variable "elasticd_release_sha256" {
  description = "SHA-256 of the file at elasticd_release_url; when set, cloud-init refuses a download that does not match. Null: not checked."
  type        = string
  default     = null

  validation {
    condition     = var.elasticd_release_sha256 == null || can(regex("^[0-9a-f]{64}$", var.elasticd_release_sha256))
    error_message = "elasticd_release_sha256 must be 64 lower-case hex digits, or null."
  }
}

variable "agent_secret" {
  description = "Shared secret of the driver and the agents: the cloud module's agent_secret input, or the one it generated when that is null."
  type        = string
  sensitive   = true

  validation {
    condition     = try(length(var.agent_secret) >= 32 && !strcontains(var.agent_secret, "\n"), false)
    error_message = "agent_secret must be at least 32 characters on one line, or null to generate one."
  }
}

variable "driver_environment" {
  description = "Environment of `elasticd run` on the driver (/etc/elasticd/driver.env): how the cloud's SDK finds its region and credentials."
  type        = map(string)
  default     = {}
}

variable "driver_ip" {
  description = "Private IP address of the driver, which the agents dial."
  type        = string
}

variable "agent_metadata" {
  description = "Which metadata service the agents watch for interruption notices (elasticd agent --metadata): aws, gcp, azure or none."
  type        = string

  validation {
    condition     = contains(["aws", "gcp", "azure", "none"], var.agent_metadata)
    error_message = "agent_metadata must be aws, gcp, azure or none."
  }
}
