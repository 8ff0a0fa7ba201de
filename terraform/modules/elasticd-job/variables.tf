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

variable "fallback_args" {
  description = "The cloud's flags of the on-demand fallback group it created (e.g. [\"--fallback-asg\", \"demo-gpu-ondemand\", \"--fallback-after\", \"10m\"]), placed after provider_args; empty (the default) without one. Needs --manage-capacity in driver_flags."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for i, a in var.fallback_args : i % 2 == 1 || startswith(a, "--fallback-")]) && length(var.fallback_args) % 2 == 0
    error_message = "fallback_args must be pairs of a --fallback-* flag and its value, e.g. [\"--fallback-asg\", \"demo-gpu-ondemand\", \"--fallback-after\", \"10m\"]."
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

variable "driver_flags" {
  description = "More flags of `elasticd run` for the driver, one argument per element, placed before -- (e.g. [\"--reset-limit\", \"5\", \"--manage-capacity\"]). Not the flags this module sets: --provider and the provider's flags, --fallback-asg and --fallback-after (fallback_args), --launcher, --listen, --agent-secret-file, --state-dir, -np, --min-np, --max-np, or --; nor those of --provider sim (--sim-*), nor a fallback group the cloud module does not create (--fallback-mig, --fallback-vmss, --fallback-instance-group). With --manage-capacity the cloud module also grants the driver the calls that steer its group."
  type        = list(string)
  default     = []

  # The flags this module and the cloud modules set (refused), and every flag of `elasticd run`
  # (a value that is not one is a typo): terraform/flags_test.go keeps both lists true to
  # cmd/elasticd and to what the modules write.
  validation {
    condition = alltrue([for f in var.driver_flags : !(startswith(f, "-") && contains([
      "", "provider", "hosts", "H", "host-discovery-script", "region", "zone", "project", "endpoint",
      "asg", "sqs-queue-url", "mig", "subscription", "resource-group", "vmss", "instance-group",
      "launcher", "listen", "agent-secret-file", "state-dir", "np", "min-np", "max-np",
      "fallback-asg", "fallback-after",
    ], replace(split("=", f)[0], "/^--?/", "")))])
    error_message = "driver_flags must not set what the module sets itself: --provider and the provider's flags (-H, --host-discovery-script, --region, --asg, --mig, ...), --launcher, --listen, --agent-secret-file, --state-dir, -np, --min-np, --max-np, \"--\" (the command is training_command), or --fallback-asg and --fallback-after (the aws module's on_demand_fallback and fallback_after create the fallback group and set them)."
  }

  validation {
    condition = alltrue([for f in var.driver_flags : !startswith(f, "-") || f == "--" || can(regex("^-[0-9]", f)) || contains([
      "H", "admin-secret-file", "agent-lease", "agent-secret-file", "agent-timeout", "asg", "barrier-timeout", "blacklist-cooldown-range",
      "checkpoint-dir", "checkpoint-every", "comm-timeout", "comm-transport", "discovery-interval", "discovery-timeout",
      "driver-addr", "elastic-timeout", "endpoint", "fallback-after", "fallback-asg", "fallback-instance-group",
      "fallback-mig", "fallback-vmss", "flap-limit", "flap-window", "host-discovery-script",
      "hosts", "instance-group", "launcher", "listen", "local-spot", "manage-capacity", "max-cost", "max-np",
      "mig", "min-np", "mode", "np", "output-dir", "prices", "project", "provider", "region",
      "replace-per-hour", "reset-limit", "resource-group", "scale-up-interval", "sim-fallback",
      "sim-hosts", "sim-interrupt-warning", "sim-max", "sim-scenario", "sim-spot-capacity", "slot-gradient",
      "slot-groups", "slot-policy", "slot-weights", "slots-per-host", "sqs-queue-url", "ssh-identity-file",
      "ssh-port", "start-timeout", "state-dir", "stop-grace", "subscription", "v", "verbose", "vmss",
      "warm-start", "zone",
    ], replace(split("=", f)[0], "/^--?/", ""))])
    error_message = "driver_flags names a flag that `elasticd run` does not have: see elasticd run --help."
  }

  # --provider sim's flags describe a simulated cloud on one machine; the driver here runs on a
  # real cloud's group, where elasticd would refuse them at start: refused at plan instead.
  validation {
    condition = alltrue([for f in var.driver_flags : !(startswith(f, "-") && contains([
      "sim-hosts", "sim-max", "sim-spot-capacity", "sim-interrupt-warning", "sim-scenario", "sim-fallback",
    ], replace(split("=", f)[0], "/^--?/", "")))])
    error_message = "driver_flags must not hold the flags of --provider sim (--sim-hosts, --sim-max, --sim-spot-capacity, --sim-interrupt-warning, --sim-scenario, --sim-fallback): they set up a simulated cloud on one machine, and this driver runs on a real cloud's group."
  }

  # The gcp, azure and ibm modules neither create a fallback group nor grant anything on one:
  # a driver given one here could not steer it. Refused at plan, until they do. (The aws
  # module creates one with on_demand_fallback, and sets its flags itself: refused above.)
  validation {
    condition = alltrue([for f in var.driver_flags : !(startswith(f, "-") && contains([
      "fallback-mig", "fallback-vmss", "fallback-instance-group",
    ], replace(split("=", f)[0], "/^--?/", "")))])
    error_message = "driver_flags must not name a fallback group (--fallback-mig, --fallback-vmss, --fallback-instance-group): the gcp, azure and ibm modules do not create a fallback group yet, nor grant the driver its calls; run such a driver with your own group and grants (docs/operations.md). On AWS, set on_demand_fallback instead."
  }

  validation {
    condition     = alltrue([for f in var.driver_flags : !can(regex("[\n\r]", f))])
    error_message = "driver_flags: each element must be one line."
  }
}

variable "driver_files" {
  description = "Files the driver's flags need (a price file, an admin secret), path -> content, written by cloud-init on the driver (root, mode 0600) before elasticd starts. Paths are absolute, under /etc/elasticd/ or /var/lib/elasticd/, and not the module's own files."
  type        = map(string)
  default     = {}

  validation {
    condition = alltrue([for p in keys(var.driver_files) :
      can(regex("^/(etc/elasticd|var/lib/elasticd)/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$", p)) && !can(regex("/\\.\\.?(/|$)", p)) &&
      !contains(["/etc/elasticd/agent-secret", "/etc/elasticd/driver.env"], p) && !startswith(p, "/var/lib/elasticd/state/")
    ])
    error_message = "driver_files: each path must be absolute, under /etc/elasticd/ or /var/lib/elasticd/ (letters, digits, . _ -), without .. and not /etc/elasticd/agent-secret, /etc/elasticd/driver.env or under /var/lib/elasticd/state/."
  }
}

variable "worker_setup_commands" {
  description = "Shell commands each GPU host runs at first boot, after installing elasticd and before starting the agent."
  type        = list(string)
  default     = []
}

variable "elasticd_release_url" {
  description = "HTTPS URL of the elasticd release to install: a .tar.gz holding an elasticd binary, or the binary itself. Give this or elasticd_release_path, not both."
  type        = string
  default     = null

  validation {
    condition     = var.elasticd_release_url == null || can(regex("^https://[^[:space:]'\"]+$", var.elasticd_release_url))
    error_message = "elasticd_release_url must be an https:// URL without spaces or quotes."
  }
}

variable "elasticd_release_path" {
  description = "Local path of a release tarball built by `make release` (dist/elasticd-VERSION-linux-ARCH.tar.gz), which the cloud module uploads to its object store and the hosts fetch with their own identity; its SHA-256 is computed here. Give this or elasticd_release_url, not both."
  type        = string
  default     = null

  validation {
    condition     = var.elasticd_release_path == null || try(fileexists(var.elasticd_release_path), false)
    error_message = "elasticd_release_path must name an existing file, such as dist/elasticd-v1.2.0-linux-amd64.tar.gz from make release (relative to where terraform runs, or absolute)."
  }

  # Its name becomes the object's key, part of a URL that curl signs or sends as it is.
  validation {
    condition     = var.elasticd_release_path == null || can(regex("^[A-Za-z0-9._-]+$", basename(coalesce(var.elasticd_release_path, "-"))))
    error_message = "elasticd_release_path: the file's name must be letters, digits, dots, dashes and underscores only, as make release names it."
  }
}

variable "elasticd_release_object" {
  description = "Set by the cloud module when it uploaded elasticd_release_path: where the object is (url) and how a host fetches it with its own identity (fetch: s3 with region, gcs, or azure-blob with the client_id of the managed identity that may read it). Null with elasticd_release_url."
  type = object({
    fetch     = string
    url       = string
    region    = optional(string, "")
    client_id = optional(string, "")
  })
  default = null

  validation {
    condition     = var.elasticd_release_object == null || try(contains(["s3", "gcs", "azure-blob"], var.elasticd_release_object.fetch), false)
    error_message = "elasticd_release_object.fetch must be s3, gcs or azure-blob."
  }

  # Rendered into the install script between single quotes.
  validation {
    condition = var.elasticd_release_object == null || try(
      !can(regex("['\"\\\\[:space:]]", var.elasticd_release_object.url)) &&
      can(regex("^[A-Za-z0-9-]*$", var.elasticd_release_object.region)) &&
      can(regex("^[A-Za-z0-9-]*$", var.elasticd_release_object.client_id)),
    false)
    error_message = "elasticd_release_object: url without quotes, backslashes or spaces; region and client_id of letters, digits and dashes."
  }
}

variable "elasticd_release_sha256" {
  description = "SHA-256 of the release (a line of dist/SHA256SUMS); when set, cloud-init refuses a download that does not match. Null: not checked with elasticd_release_url, computed from the file with elasticd_release_path."
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
