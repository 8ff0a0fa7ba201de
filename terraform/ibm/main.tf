# An elastic training cluster on IBM Cloud VPC: a standard driver instance running
# `elasticd run`, and an instance group of spot GPU instances running `elasticd agent`.

locals {
  group_name  = "${var.name}-gpu"
  driver_port = module.job.driver_port
  profile     = var.credentials == "trusted_profile"

  agent_secret = var.agent_secret != null ? var.agent_secret : random_password.agent_secret[0].result

  # How providers/ibm finds its credentials: the VPC SDK's "vpc" authenticator, which trades
  # the instance identity token for the trusted profile's IAM token; or an API key.
  driver_environment = local.profile ? {
    VPC_AUTH_TYPE      = "vpc"
    VPC_IAM_PROFILE_ID = ibm_iam_trusted_profile.driver[0].id
    } : {
    IBMCLOUD_API_KEY = var.driver_api_key
  }
}

# The job (np, the training command, the release) and what the hosts run, validated and rendered
# by the module every cloud shares; this module passes what is its own: the provider's flags,
# the driver's environment and address, the metadata service the agents watch.
module "job" {
  source = "../modules/elasticd-job"

  name = var.name
  provider_args = [
    "--provider", "ibm",
    "--region", var.region,
    "--instance-group", local.group_name,
  ]
  driver_environment      = local.driver_environment
  driver_ip               = ibm_is_instance.driver.primary_network_interface[0].primary_ip[0].address
  agent_metadata          = "none"
  agent_secret            = local.agent_secret
  np                      = var.np
  min_np                  = var.min_np
  max_np                  = var.max_np
  training_command        = var.training_command
  worker_setup_commands   = var.worker_setup_commands
  driver_flags            = var.driver_flags
  driver_files            = var.driver_files
  elasticd_release_url    = var.elasticd_release_url
  elasticd_release_sha256 = var.elasticd_release_sha256
}

resource "random_password" "agent_secret" {
  count = var.agent_secret == null ? 1 : 0

  length  = 48
  special = false
}

# --- Network: the driver's port and the workers' mesh, inside the VPC only ---

resource "ibm_is_security_group" "driver" {
  name           = "${var.name}-driver"
  vpc            = var.vpc_id
  resource_group = var.resource_group_id
  tags           = var.tags
}

resource "ibm_is_security_group" "gpu" {
  name           = "${var.name}-gpu"
  vpc            = var.vpc_id
  resource_group = var.resource_group_id
  tags           = var.tags
}

resource "ibm_is_security_group_rule" "driver_from_gpu" {
  group     = ibm_is_security_group.driver.id
  direction = "inbound"
  remote    = ibm_is_security_group.gpu.id

  tcp {
    port_min = local.driver_port
    port_max = local.driver_port
  }
}

resource "ibm_is_security_group_rule" "driver_ssh" {
  count = var.ssh_cidr == null ? 0 : 1

  group     = ibm_is_security_group.driver.id
  direction = "inbound"
  remote    = var.ssh_cidr

  tcp {
    port_min = 22
    port_max = 22
  }
}

# The live page, /v1/status and /metrics from live_page_cidrs: none by default.
resource "ibm_is_security_group_rule" "driver_live_page" {
  for_each = toset(var.live_page_cidrs)

  group     = ibm_is_security_group.driver.id
  direction = "inbound"
  remote    = each.value

  tcp {
    port_min = local.driver_port
    port_max = local.driver_port
  }
}

resource "ibm_is_security_group_rule" "gpu_mesh" {
  group     = ibm_is_security_group.gpu.id
  direction = "inbound"
  remote    = ibm_is_security_group.gpu.id

  tcp {
    port_min = 1
    port_max = 65535
  }
}

resource "ibm_is_security_group_rule" "driver_out" {
  group     = ibm_is_security_group.driver.id
  direction = "outbound"
  remote    = "0.0.0.0/0"
}

resource "ibm_is_security_group_rule" "gpu_out" {
  group     = ibm_is_security_group.gpu.id
  direction = "outbound"
  remote    = "0.0.0.0/0"
}

# --- The driver instance ---

resource "ibm_is_instance" "driver" {
  name           = "${var.name}-driver"
  vpc            = var.vpc_id
  zone           = var.driver_zone
  profile        = var.driver_profile
  image          = var.driver_image_id
  keys           = var.ssh_key_ids
  resource_group = var.resource_group_id
  tags           = var.tags

  primary_network_interface {
    subnet          = var.driver_subnet_id
    security_groups = [ibm_is_security_group.driver.id]
  }

  # The trusted profile's token comes from the instance metadata service.
  metadata_service {
    enabled  = true
    protocol = "https"
  }

  user_data = module.job.driver_user_data

  lifecycle {
    precondition {
      condition     = (var.credentials == "api_key") == (var.driver_api_key != null)
      error_message = "driver_api_key is needed with credentials = \"api_key\", and only then."
    }
  }
}

resource "ibm_is_floating_ip" "driver" {
  count = var.driver_public_ip ? 1 : 0

  name           = "${var.name}-driver"
  target         = ibm_is_instance.driver.primary_network_interface[0].id
  resource_group = var.resource_group_id
  tags           = var.tags
}

# --- The driver's identity: a trusted profile for the driver instance ---

resource "ibm_iam_trusted_profile" "driver" {
  count = local.profile ? 1 : 0

  name        = "${var.name}-driver"
  description = "elasticd driver of ${var.name}: reads the GPU instance group"
}

resource "ibm_iam_trusted_profile_link" "driver" {
  count = local.profile ? 1 : 0

  profile_id = ibm_iam_trusted_profile.driver[0].id
  cr_type    = "VSI"

  link {
    crn  = ibm_is_instance.driver.crn
    name = ibm_is_instance.driver.name
  }
}

# Kept equal to the SDK calls of providers/ibm by terraform/permissions_test.go: discovery
# reads instance groups and instances, which the Viewer role allows, in the cluster's resource
# group only; steering the group (below) needs Editor.
resource "ibm_iam_trusted_profile_policy" "instance_groups" {
  count = local.profile ? 1 : 0

  profile_id  = ibm_iam_trusted_profile.driver[0].id
  description = "elasticd: list the instance groups and their memberships"
  roles       = ["Viewer"]

  resources {
    service           = "is"
    resource_group_id = var.resource_group_id
    attributes = {
      instanceGroupId = "*"
    }
  }
}

resource "ibm_iam_trusted_profile_policy" "instances" {
  count = local.profile ? 1 : 0

  profile_id  = ibm_iam_trusted_profile.driver[0].id
  description = "elasticd: list the instances of the group"
  roles       = ["Viewer"]

  resources {
    service           = "is"
    resource_group_id = var.resource_group_id
    attributes = {
      instanceId = "*"
    }
  }
}

# Only with --manage-capacity in driver_flags: set the group's membership count (after turning
# an autoscale manager off) and delete a broken member's membership, on this group alone. The
# membership's instance is deleted with it, which needs Editor on instances too: they cannot be
# named ahead (the group makes them), so that grant is on the resource group's instances.
resource "ibm_iam_trusted_profile_policy" "instance_group_capacity" {
  count = local.profile && module.job.manage_capacity ? 1 : 0

  profile_id  = ibm_iam_trusted_profile.driver[0].id
  description = "elasticd: set the size of the GPU instance group and replace its members"
  roles       = ["Editor"]

  resources {
    service           = "is"
    resource_group_id = var.resource_group_id
    attributes = {
      instanceGroupId = ibm_is_instance_group.gpu.id
    }
  }
}

resource "ibm_iam_trusted_profile_policy" "instance_capacity" {
  count = local.profile && module.job.manage_capacity ? 1 : 0

  profile_id  = ibm_iam_trusted_profile.driver[0].id
  description = "elasticd: delete the instance of a member it replaces"
  roles       = ["Editor"]

  resources {
    service           = "is"
    resource_group_id = var.resource_group_id
    attributes = {
      instanceId = "*"
    }
  }
}

# --- The spot GPU instance group ---

resource "ibm_is_instance_template" "gpu" {
  name           = "${var.name}-gpu"
  vpc            = var.vpc_id
  zone           = var.gpu_zone
  profile        = var.gpu_profile
  image          = var.gpu_image_id
  keys           = var.ssh_key_ids
  resource_group = var.resource_group_id

  # Spot instances ("availability class" spot) need a provider recent enough to know them.
  availability {
    class = var.spot ? "spot" : "standard"
  }

  primary_network_interface {
    subnet          = var.gpu_subnet_ids[0]
    security_groups = [ibm_is_security_group.gpu.id]
  }

  user_data = module.job.agent_user_data
}

resource "ibm_is_instance_group" "gpu" {
  name              = local.group_name
  instance_template = ibm_is_instance_template.gpu.id
  instance_count    = var.gpu_instances
  subnets           = var.gpu_subnet_ids
  resource_group    = var.resource_group_id
  tags              = var.tags

  # The group's membership count is the driver's once the group exists (with
  # --manage-capacity it sets it, to 0 when the job ends): an apply must not put it back. The
  # module makes no instance group manager, whose management_enabled the driver would turn off.
  lifecycle {
    ignore_changes = [instance_count]
  }
}
