# An elastic training cluster on Azure: an on-demand driver VM running `elasticd run`, and a
# Uniform virtual machine scale set of Spot GPU VMs running `elasticd agent`.

data "azurerm_subscription" "current" {}

data "azurerm_resource_group" "cluster" {
  name = var.resource_group_name
}

locals {
  vmss_name   = "${var.name}-gpu"
  driver_port = module.job.driver_port

  agent_secret = var.agent_secret != null ? var.agent_secret : random_password.agent_secret[0].result

  tags = merge(var.tags, { elasticd-cluster = var.name })

  # A release given as a local file (elasticd_release_path) is uploaded to a storage container
  # and read with the managed identity "release"; one given as a URL is fetched as it is.
  release_upload = var.elasticd_release_path != null
}

# The job (np, the training command, the release) and what the hosts run, validated and rendered
# by the module every cloud shares; this module passes what is its own: the provider's flags,
# the driver's environment and address, the metadata service the agents watch.
module "job" {
  source = "../modules/elasticd-job"

  name = var.name
  provider_args = [
    "--provider", "azure",
    "--subscription", data.azurerm_subscription.current.subscription_id,
    "--resource-group", var.resource_group_name,
    "--vmss", local.vmss_name,
  ]
  # AZURE_CLIENT_ID picks the user-assigned identity for DefaultAzureCredential.
  driver_environment      = { AZURE_CLIENT_ID = azurerm_user_assigned_identity.driver.client_id }
  driver_ip               = azurerm_network_interface.driver.private_ip_address
  agent_metadata          = "azure"
  agent_secret            = local.agent_secret
  np                      = var.np
  min_np                  = var.min_np
  max_np                  = var.max_np
  training_command        = var.training_command
  worker_setup_commands   = var.worker_setup_commands
  driver_flags            = var.driver_flags
  driver_files            = var.driver_files
  elasticd_release_url    = var.elasticd_release_url
  elasticd_release_path   = var.elasticd_release_path
  elasticd_release_sha256 = var.elasticd_release_sha256
  elasticd_release_object = local.release_upload ? {
    fetch     = "azure-blob"
    url       = azurerm_storage_blob.release[0].url
    client_id = azurerm_user_assigned_identity.release[0].client_id
  } : null
}

resource "random_password" "agent_secret" {
  count = var.agent_secret == null ? 1 : 0

  length  = 48
  special = false
}

# --- Network: the driver's port and the workers' mesh, inside the virtual network only ---

resource "azurerm_application_security_group" "driver" {
  name                = "${var.name}-driver"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags
}

resource "azurerm_application_security_group" "gpu" {
  name                = "${var.name}-gpu"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags
}

# One group for the driver's and the GPU VMs' NICs. Azure's default rules let the whole
# virtual network in; DenyOtherVnetInbound narrows that to the two rules above it. Inbound
# from the internet is denied by the default rules.
resource "azurerm_network_security_group" "cluster" {
  name                = "${var.name}-cluster"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags

  security_rule {
    name                                       = "DriverFromGpu"
    description                                = "elasticd agents and workers to the driver"
    priority                                   = 1000
    direction                                  = "Inbound"
    access                                     = "Allow"
    protocol                                   = "Tcp"
    source_port_range                          = "*"
    destination_port_range                     = tostring(local.driver_port)
    source_application_security_group_ids      = [azurerm_application_security_group.gpu.id]
    destination_application_security_group_ids = [azurerm_application_security_group.driver.id]
  }

  security_rule {
    name                                       = "GpuMesh"
    description                                = "workers to workers (allreduce on ephemeral ports)"
    priority                                   = 1010
    direction                                  = "Inbound"
    access                                     = "Allow"
    protocol                                   = "Tcp"
    source_port_range                          = "*"
    destination_port_range                     = "*"
    source_application_security_group_ids      = [azurerm_application_security_group.gpu.id]
    destination_application_security_group_ids = [azurerm_application_security_group.gpu.id]
  }

  # The live page, /v1/status and /metrics from live_page_cidrs: none by default.
  dynamic "security_rule" {
    for_each = length(var.live_page_cidrs) > 0 ? [var.live_page_cidrs] : []

    content {
      name                                       = "DriverLivePage"
      description                                = "the driver's live page (read-only, unauthenticated)"
      priority                                   = 1030
      direction                                  = "Inbound"
      access                                     = "Allow"
      protocol                                   = "Tcp"
      source_port_range                          = "*"
      destination_port_range                     = tostring(local.driver_port)
      source_address_prefixes                    = security_rule.value
      destination_application_security_group_ids = [azurerm_application_security_group.driver.id]
    }
  }

  dynamic "security_rule" {
    for_each = var.ssh_cidr == null ? [] : [var.ssh_cidr]

    content {
      name                                       = "DriverSsh"
      description                                = "ssh to the driver"
      priority                                   = 1020
      direction                                  = "Inbound"
      access                                     = "Allow"
      protocol                                   = "Tcp"
      source_port_range                          = "*"
      destination_port_range                     = "22"
      source_address_prefix                      = security_rule.value
      destination_application_security_group_ids = [azurerm_application_security_group.driver.id]
    }
  }

  security_rule {
    name                       = "DenyOtherVnetInbound"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "VirtualNetwork"
    destination_address_prefix = "*"
  }
}

# --- The driver VM and its identity ---

resource "azurerm_user_assigned_identity" "driver" {
  name                = "${var.name}-driver"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags
}

resource "azurerm_public_ip" "driver" {
  count = var.driver_public_ip ? 1 : 0

  name                = "${var.name}-driver"
  resource_group_name = var.resource_group_name
  location            = var.location
  allocation_method   = "Static"
  sku                 = "Standard"
  tags                = local.tags
}

resource "azurerm_network_interface" "driver" {
  name                = "${var.name}-driver"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags

  ip_configuration {
    name                          = "primary"
    subnet_id                     = var.subnet_id
    private_ip_address_allocation = "Dynamic"
    public_ip_address_id          = var.driver_public_ip ? azurerm_public_ip.driver[0].id : null
  }
}

resource "azurerm_network_interface_security_group_association" "driver" {
  network_interface_id      = azurerm_network_interface.driver.id
  network_security_group_id = azurerm_network_security_group.cluster.id
}

resource "azurerm_network_interface_application_security_group_association" "driver" {
  network_interface_id          = azurerm_network_interface.driver.id
  application_security_group_id = azurerm_application_security_group.driver.id
}

resource "azurerm_linux_virtual_machine" "driver" {
  name                  = "${var.name}-driver"
  resource_group_name   = var.resource_group_name
  location              = var.location
  size                  = var.driver_vm_size
  admin_username        = var.admin_username
  network_interface_ids = [azurerm_network_interface.driver.id]
  tags                  = local.tags

  custom_data = base64encode(module.job.driver_user_data)

  admin_ssh_key {
    username   = var.admin_username
    public_key = var.ssh_public_key
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "StandardSSD_LRS"
  }

  source_image_reference {
    publisher = var.driver_image.publisher
    offer     = var.driver_image.offer
    sku       = var.driver_image.sku
    version   = var.driver_image.version
  }

  # The driver's own identity (AZURE_CLIENT_ID picks it for elasticd) and, with
  # elasticd_release_path, the one that may read the release.
  identity {
    type         = "UserAssigned"
    identity_ids = concat([azurerm_user_assigned_identity.driver.id], azurerm_user_assigned_identity.release[*].id)
  }

  depends_on = [azurerm_role_assignment.release]
}

# --- The Spot GPU scale set ---

resource "azurerm_linux_virtual_machine_scale_set" "gpu" {
  name                = local.vmss_name
  resource_group_name = var.resource_group_name
  location            = var.location
  sku                 = var.gpu_vm_size
  instances           = var.gpu_instances
  zones               = length(var.gpu_zones) > 0 ? var.gpu_zones : null
  admin_username      = var.admin_username
  upgrade_mode        = "Manual"
  priority            = "Spot"
  eviction_policy     = var.eviction_policy
  max_bid_price       = var.max_bid_price
  tags                = local.tags

  custom_data = base64encode(module.job.agent_user_data)

  admin_ssh_key {
    username   = var.admin_username
    public_key = var.ssh_public_key
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "StandardSSD_LRS"
  }

  source_image_reference {
    publisher = var.gpu_image.publisher
    offer     = var.gpu_image.offer
    sku       = var.gpu_image.sku
    version   = var.gpu_image.version
  }

  network_interface {
    name                      = "primary"
    primary                   = true
    network_security_group_id = azurerm_network_security_group.cluster.id

    ip_configuration {
      name                           = "primary"
      primary                        = true
      subnet_id                      = var.subnet_id
      application_security_group_ids = [azurerm_application_security_group.gpu.id]
    }
  }

  # Only with elasticd_release_path: the identity that may read the release, nothing else.
  dynamic "identity" {
    for_each = azurerm_user_assigned_identity.release

    content {
      type         = "UserAssigned"
      identity_ids = [identity.value.id]
    }
  }

  # The set's capacity is the driver's once the set exists (with --manage-capacity it sets it,
  # to 0 when the job ends): an apply must not put instances back.
  lifecycle {
    ignore_changes = [instances]
  }

  depends_on = [azurerm_role_assignment.release]
}

# --- The release from elasticd_release_path: a blob, read with the identity "release" ---

# The VMs fetch it with curl and the identity's token from IMDS
# (modules/elasticd-job/templates/install-elasticd.sh.tftpl). The account holds only the release.
resource "random_id" "release" {
  count = local.release_upload ? 1 : 0

  byte_length = 4
}

resource "azurerm_storage_account" "release" {
  count = local.release_upload ? 1 : 0

  # 3 to 24 lower-case letters and digits, unique in Azure.
  name                            = "elasticd${substr(replace(var.name, "-", ""), 0, 8)}${random_id.release[0].hex}"
  resource_group_name             = var.resource_group_name
  location                        = var.location
  account_tier                    = "Standard"
  account_replication_type        = "LRS"
  min_tls_version                 = "TLS1_2"
  allow_nested_items_to_be_public = false
  tags                            = local.tags
}

resource "azurerm_storage_container" "release" {
  count = local.release_upload ? 1 : 0

  name                  = "elasticd"
  storage_account_id    = azurerm_storage_account.release[0].id
  container_access_type = "private"
}

resource "azurerm_storage_blob" "release" {
  count = local.release_upload ? 1 : 0

  name                   = "releases/${basename(var.elasticd_release_path)}"
  storage_account_name   = azurerm_storage_account.release[0].name
  storage_container_name = azurerm_storage_container.release[0].name
  type                   = "Block"
  source                 = var.elasticd_release_path
  content_md5            = filemd5(var.elasticd_release_path)
}

resource "azurerm_user_assigned_identity" "release" {
  count = local.release_upload ? 1 : 0

  name                = "${var.name}-release"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags
}

# Kept to reading blobs of the release's container by terraform/release_test.go.
resource "azurerm_role_assignment" "release" {
  count = local.release_upload ? 1 : 0

  scope                = azurerm_storage_container.release[0].id
  role_definition_name = "Storage Blob Data Reader"
  principal_id         = azurerm_user_assigned_identity.release[0].principal_id
}

# --- The driver's role: exactly the calls providers/azure makes, on the scale set only ---

# Kept equal to the SDK calls of providers/azure by terraform/permissions_test.go. A custom
# role is defined at a resource group (the narrowest assignable scope Azure takes) and
# assigned on the scale set alone.
resource "azurerm_role_definition" "driver" {
  name              = "elasticd driver (${var.name})"
  scope             = data.azurerm_resource_group.cluster.id
  description       = "Reads the elasticd GPU scale set, its VMs and their network interfaces."
  assignable_scopes = [data.azurerm_resource_group.cluster.id]

  permissions {
    actions = [
      "Microsoft.Compute/virtualMachineScaleSets/read",
      "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
      "Microsoft.Network/networkInterfaces/read",
      # elasticd check: the driver's own permissions on the scale set, asked without acting.
      "Microsoft.Authorization/permissions/read",
    ]
  }
}

resource "azurerm_role_assignment" "driver" {
  scope              = azurerm_linux_virtual_machine_scale_set.gpu.id
  role_definition_id = azurerm_role_definition.driver.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.driver.principal_id
  principal_type     = "ServicePrincipal"
}

# Only with --manage-capacity in driver_flags: set the scale set's capacity (its write, a PATCH,
# which also writes the driver's claim, the set's elasticd-driver tag) and delete one broken VM
# from it (delete/action), assigned on the scale set alone like the
# role above. A role of its own, so that a driver that does not steer its set cannot change it.
resource "azurerm_role_definition" "capacity" {
  count = module.job.manage_capacity ? 1 : 0

  name              = "elasticd capacity (${var.name})"
  scope             = data.azurerm_resource_group.cluster.id
  description       = "Sets the capacity of the elasticd GPU scale set and deletes its broken VMs."
  assignable_scopes = [data.azurerm_resource_group.cluster.id]

  permissions {
    actions = [
      "Microsoft.Compute/virtualMachineScaleSets/write",
      "Microsoft.Compute/virtualMachineScaleSets/delete/action",
    ]
  }
}

resource "azurerm_role_assignment" "capacity" {
  count = module.job.manage_capacity ? 1 : 0

  scope              = azurerm_linux_virtual_machine_scale_set.gpu.id
  role_definition_id = azurerm_role_definition.capacity[0].role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.driver.principal_id
  principal_type     = "ServicePrincipal"
}
