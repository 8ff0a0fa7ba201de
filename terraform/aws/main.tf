# An elastic training cluster on EC2: an on-demand driver instance running `elasticd run`, and
# a spot Auto Scaling group of GPU instances running `elasticd agent`. Interruption notices
# reach the driver through EventBridge rules and an SQS queue.

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

locals {
  asg_name    = "${var.name}-gpu"
  queue_name  = "${var.name}-notices"
  hook_name   = "${var.name}-drain"
  driver_port = module.job.driver_port

  agent_secret = var.agent_secret != null ? var.agent_secret : random_password.agent_secret[0].result

  # EventBridge patterns for every event the provider turns into a notice
  # (docs/providers/aws.md, "The notice queue and its rules").
  event_patterns = {
    spot = {
      source      = ["aws.ec2"]
      detail-type = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]
    }
    state = {
      source      = ["aws.ec2"]
      detail-type = ["EC2 Instance State-change Notification"]
      detail      = { state = ["stopping", "stopped", "shutting-down", "terminated"] }
    }
    lifecycle = {
      source      = ["aws.autoscaling"]
      detail-type = ["EC2 Instance-terminate Lifecycle Action"]
      detail      = { AutoScalingGroupName = [local.asg_name] }
    }
    health = {
      source      = ["aws.health"]
      detail-type = ["AWS Health Event"]
      detail      = { service = ["EC2"], eventTypeCategory = ["scheduledChange"] }
    }
  }

  tags = merge(var.tags, { "elasticd:cluster" = var.name })

  # The group, as IAM names it: the driver's writes to the group are granted on it alone.
  asg_arn = "arn:${data.aws_partition.current.partition}:autoscaling:${var.region}:${data.aws_caller_identity.current.account_id}:autoScalingGroup:*:autoScalingGroupName/${local.asg_name}"

  # The on-demand fallback group (on_demand_fallback), as the driver and IAM name it: the
  # driver's writes to it are granted on it alone, and only when it exists.
  fallback_asg_name = "${var.name}-gpu-ondemand"
  fallback_asg_arn  = "arn:${data.aws_partition.current.partition}:autoscaling:${var.region}:${data.aws_caller_identity.current.account_id}:autoScalingGroup:*:autoScalingGroupName/${local.fallback_asg_name}"

  # A release given as a local file (elasticd_release_path) is uploaded to S3 and read by the
  # instances with their roles; one given as a URL is fetched as it is.
  release_upload = var.elasticd_release_path != null
  release_key    = local.release_upload ? "releases/${basename(var.elasticd_release_path)}" : ""
}

# The job (np, the training command, the release) and what the hosts run, validated and rendered
# by the module every cloud shares; this module passes what is its own: the provider's flags,
# the driver's environment and address, the metadata service the agents watch.
module "job" {
  source = "../modules/elasticd-job"

  name = var.name
  provider_args = [
    "--provider", "aws",
    "--asg", local.asg_name,
    "--region", var.region,
    "--sqs-queue-url", aws_sqs_queue.notices.url,
  ]
  # With on_demand_fallback (the shared module refuses it without --manage-capacity).
  fallback_args = var.on_demand_fallback ? [
    "--fallback-asg", local.fallback_asg_name,
    "--fallback-after", var.fallback_after,
  ] : []
  driver_environment      = { AWS_REGION = var.region }
  driver_ip               = aws_instance.driver.private_ip
  agent_metadata          = "aws"
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
    fetch  = "s3"
    url    = "https://${aws_s3_bucket.release[0].bucket_regional_domain_name}/${local.release_key}"
    region = var.region
  } : null
}

resource "random_password" "agent_secret" {
  count = var.agent_secret == null ? 1 : 0

  length  = 48
  special = false
}

# --- Network: the driver's port and the workers' mesh, inside the VPC only ---

resource "aws_security_group" "driver" {
  name        = "${var.name}-driver"
  description = "elasticd driver of ${var.name}: TCP ${local.driver_port} from the GPU instances"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_security_group" "gpu" {
  name        = "${var.name}-gpu"
  description = "elasticd GPU instances of ${var.name}: all TCP among themselves"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "driver_from_gpu" {
  security_group_id            = aws_security_group.driver.id
  description                  = "elasticd agents and workers to the driver"
  ip_protocol                  = "tcp"
  from_port                    = local.driver_port
  to_port                      = local.driver_port
  referenced_security_group_id = aws_security_group.gpu.id
}

resource "aws_vpc_security_group_ingress_rule" "driver_ssh" {
  count = var.ssh_cidr == null ? 0 : 1

  security_group_id = aws_security_group.driver.id
  description       = "ssh to the driver"
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
  cidr_ipv4         = var.ssh_cidr
}

# The live page, /v1/status and /metrics from live_page_cidrs: none by default (docs/deploy-aws.md).
resource "aws_vpc_security_group_ingress_rule" "driver_live_page" {
  for_each = toset(var.live_page_cidrs)

  security_group_id = aws_security_group.driver.id
  description       = "the driver's live page (read-only, unauthenticated) from ${each.value}"
  ip_protocol       = "tcp"
  from_port         = local.driver_port
  to_port           = local.driver_port
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "gpu_mesh" {
  security_group_id            = aws_security_group.gpu.id
  description                  = "workers to workers (allreduce on ephemeral ports)"
  ip_protocol                  = "tcp"
  from_port                    = 0
  to_port                      = 65535
  referenced_security_group_id = aws_security_group.gpu.id
}

resource "aws_vpc_security_group_egress_rule" "driver_out" {
  security_group_id = aws_security_group.driver.id
  description       = "AWS APIs and the elasticd download"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "gpu_out" {
  security_group_id = aws_security_group.gpu.id
  description       = "the driver, the other workers, the elasticd download"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

# --- Notices: EventBridge rules -> SQS queue, read by the driver ---

resource "aws_sqs_queue" "notices" {
  name = local.queue_name
  # A notice older than this is about an instance long gone.
  message_retention_seconds = 3600
  # SQS-managed keys: no kms:Decrypt for the driver to need.
  sqs_managed_sse_enabled = true
  tags                    = local.tags
}

resource "aws_cloudwatch_event_rule" "notices" {
  for_each = local.event_patterns

  name          = "${var.name}-${each.key}"
  description   = "elasticd notices (${each.key}) for ${var.name}"
  event_pattern = jsonencode(each.value)
  tags          = local.tags
}

resource "aws_cloudwatch_event_target" "notices" {
  for_each = local.event_patterns

  rule = aws_cloudwatch_event_rule.notices[each.key].name
  arn  = aws_sqs_queue.notices.arn
}

data "aws_iam_policy_document" "queue" {
  statement {
    sid       = "EventBridge"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.notices.arn]

    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [for r in aws_cloudwatch_event_rule.notices : r.arn]
    }
  }
}

resource "aws_sqs_queue_policy" "notices" {
  queue_url = aws_sqs_queue.notices.id
  policy    = data.aws_iam_policy_document.queue.json
}

# --- The driver's IAM role: exactly the calls providers/aws makes ---

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

# Kept equal to the SDK calls of providers/aws by terraform/permissions_test.go.
data "aws_iam_policy_document" "driver" {
  statement {
    sid = "Discover"
    # Neither action supports resource-level permissions.
    actions   = ["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances"]
    resources = ["*"]
  }

  statement {
    sid = "SpotPrices"
    # Cost accounting: the current spot prices of the group's instance types, about hourly.
    # No resource-level permissions either.
    actions   = ["ec2:DescribeSpotPriceHistory"]
    resources = ["*"]
  }

  statement {
    sid = "Notices"
    # sqs:DeleteMessage also covers DeleteMessageBatch, which is what the provider calls.
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
    resources = [aws_sqs_queue.notices.arn]
  }

  statement {
    sid       = "ScaleIn"
    actions   = ["autoscaling:CompleteLifecycleAction"]
    resources = [local.asg_arn]
  }

  # elasticd check: the driver's own permissions, asked of IAM without acting (on this role
  # alone), and the notice queue's attributes and the EventBridge rules that feed it, read.
  # sts:GetCallerIdentity needs no permission.
  statement {
    sid       = "CheckPermissions"
    actions   = ["iam:SimulatePrincipalPolicy", "iam:GetRole"]
    resources = [aws_iam_role.driver.arn]
  }

  statement {
    sid       = "CheckQueue"
    actions   = ["sqs:GetQueueAttributes"]
    resources = [aws_sqs_queue.notices.arn]
  }

  statement {
    sid = "CheckNoticeRules"
    # ListRuleNamesByTarget takes no resource; DescribeRule reads whichever rules it names.
    actions   = ["events:ListRuleNamesByTarget", "events:DescribeRule"]
    resources = ["*"]
  }

  # Only with --manage-capacity in driver_flags: the driver sets the group's size (lowering its
  # minimum to go below it) and hands broken instances back, on this group alone.
  dynamic "statement" {
    for_each = module.job.manage_capacity ? ["SteerCapacity"] : []

    content {
      sid = statement.value
      actions = [
        "autoscaling:SetDesiredCapacity",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
      ]
      resources = [local.asg_arn]
    }
  }

  # Only with on_demand_fallback too: the same three calls on the fallback group, which the
  # driver grows while spot is out, sets back to zero and hands broken instances of. It reads
  # it with the unscoped Describe* above, and never reads its scaling activities.
  dynamic "statement" {
    for_each = module.job.manage_capacity && var.on_demand_fallback ? ["SteerFallback"] : []

    content {
      sid = statement.value
      actions = [
        "autoscaling:SetDesiredCapacity",
        "autoscaling:UpdateAutoScalingGroup",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
      ]
      resources = [local.fallback_asg_arn]
    }
  }

  # And, with the fallback too, the driver's claim on the fallback group, which it claims with
  # the spot group (cmd/elasticd claimGroups): the same elasticd-driver tag, on that group alone.
  dynamic "statement" {
    for_each = module.job.manage_capacity && var.on_demand_fallback ? ["ClaimFallback"] : []

    content {
      sid       = statement.value
      actions   = ["autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"]
      resources = [local.fallback_asg_arn]
    }
  }

  # And reads the group's failed launches: Describe* has no resource-level permissions.
  dynamic "statement" {
    for_each = module.job.manage_capacity ? ["LaunchFailures"] : []

    content {
      sid       = statement.value
      actions   = ["autoscaling:DescribeScalingActivities"]
      resources = ["*"]
    }
  }

  # --- The driver's claim on its group (--manage-capacity only) ---
  # The driver tags the group it steers, elasticd-driver = "job=<id>;host=<h>;at=<time>", so
  # that a second driver started on it refuses (docs/operations.md, "One driver per group"),
  # refreshes the tag every check and removes it at the job's end. One tag of this group
  # alone: the tag is read with DescribeAutoScalingGroups, granted above.
  dynamic "statement" {
    for_each = module.job.manage_capacity ? ["ClaimGroup"] : []

    content {
      sid       = statement.value
      actions   = ["autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"]
      resources = [local.asg_arn]
    }
  }
}

resource "aws_iam_role" "driver" {
  name               = "${var.name}-driver"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "driver" {
  name   = "elasticd-driver"
  role   = aws_iam_role.driver.id
  policy = data.aws_iam_policy_document.driver.json
}

resource "aws_iam_instance_profile" "driver" {
  name = "${var.name}-driver"
  role = aws_iam_role.driver.name
  tags = local.tags
}

# --- The release from elasticd_release_path: an S3 object, read by the instances' roles ---

# The instances fetch it with curl alone: SigV4 signed by curl (--aws-sigv4) with the role's
# credentials from IMDSv2 (modules/elasticd-job/templates/install-elasticd.sh.tftpl). Neither a
# VPC endpoint nor a public object is needed, and the grant is one action on one object.
resource "aws_s3_bucket" "release" {
  count = local.release_upload ? 1 : 0

  bucket_prefix = "elasticd-${substr(var.name, 0, 27)}-"
  # The bucket holds only the uploaded release, which Terraform also manages.
  force_destroy = true
  tags          = local.tags
}

resource "aws_s3_bucket_public_access_block" "release" {
  count = local.release_upload ? 1 : 0

  bucket                  = aws_s3_bucket.release[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_object" "release" {
  count = local.release_upload ? 1 : 0

  bucket      = aws_s3_bucket.release[0].id
  key         = local.release_key
  source      = var.elasticd_release_path
  source_hash = filesha256(var.elasticd_release_path)
  tags        = local.tags
}

# Kept to s3:GetObject on the one object by terraform/release_test.go.
data "aws_iam_policy_document" "release" {
  count = local.release_upload ? 1 : 0

  statement {
    sid       = "Release"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.release[0].arn}/${aws_s3_object.release[0].key}"]
  }
}

resource "aws_iam_role_policy" "driver_release" {
  count = local.release_upload ? 1 : 0

  name   = "elasticd-release"
  role   = aws_iam_role.driver.id
  policy = data.aws_iam_policy_document.release[0].json
}

# The GPU instances get a role only to read the release: nothing else.
resource "aws_iam_role" "gpu" {
  count = local.release_upload ? 1 : 0

  name               = "${var.name}-gpu"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "gpu_release" {
  count = local.release_upload ? 1 : 0

  name   = "elasticd-release"
  role   = aws_iam_role.gpu[0].id
  policy = data.aws_iam_policy_document.release[0].json
}

resource "aws_iam_instance_profile" "gpu" {
  count = local.release_upload ? 1 : 0

  name = "${var.name}-gpu"
  role = aws_iam_role.gpu[0].name
  tags = local.tags
}

# --- The driver instance ---

resource "aws_instance" "driver" {
  ami                         = var.driver_ami_id
  instance_type               = var.driver_instance_type
  subnet_id                   = var.driver_subnet_id
  vpc_security_group_ids      = [aws_security_group.driver.id]
  iam_instance_profile        = aws_iam_instance_profile.driver.name
  associate_public_ip_address = var.driver_public_ip
  key_name                    = var.key_name

  user_data                   = module.job.driver_user_data
  user_data_replace_on_change = true

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required"
  }

  tags = merge(local.tags, { Name = "${var.name}-driver" })

  # The role's policies must exist before elasticd's first poll (and the release's download),
  # or they are refused.
  depends_on = [aws_iam_role_policy.driver, aws_iam_role_policy.driver_release]
}

# --- The spot GPU group ---

resource "aws_launch_template" "gpu" {
  name_prefix            = "${var.name}-gpu-"
  image_id               = var.gpu_ami_id
  key_name               = var.key_name
  vpc_security_group_ids = [aws_security_group.gpu.id]

  user_data = base64encode(module.job.agent_user_data)

  # Only with elasticd_release_path: the role that may read the uploaded release.
  dynamic "iam_instance_profile" {
    for_each = aws_iam_instance_profile.gpu

    content {
      arn = iam_instance_profile.value.arn
    }
  }

  # The agent reads spot interruption notices from the instance metadata service.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 2
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${var.name}-gpu" })
  }

  tags = local.tags
}

resource "aws_autoscaling_group" "gpu" {
  name                = local.asg_name
  min_size            = var.min_size
  max_size            = var.max_size
  desired_capacity    = var.desired_capacity
  vpc_zone_identifier = var.gpu_subnet_ids
  capacity_rebalance  = true

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = 0
      on_demand_percentage_above_base_capacity = 0
      spot_allocation_strategy                 = var.spot_allocation_strategy
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.gpu.id
        version            = aws_launch_template.gpu.latest_version
      }

      dynamic "override" {
        for_each = var.gpu_instance_types

        content {
          instance_type = override.value
        }
      }
    }
  }

  # A new launch template version (the driver was replaced and has a new private IP, or the
  # setup commands or the release changed) replaces the running instances, whose agents would
  # otherwise keep dialling the old driver. All at once: the job restarts anyway.
  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage = 0
    }
  }

  # Part of the group from its creation, so that even its first instances wait for the
  # driver to move their workers off before they terminate.
  initial_lifecycle_hook {
    name                 = local.hook_name
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
    heartbeat_timeout    = var.lifecycle_hook_timeout
    default_result       = "CONTINUE"
  }

  dynamic "tag" {
    for_each = local.tags

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  # The group's size is the driver's once the group exists: desired_capacity changes as
  # instances are interrupted and replaced, and with --manage-capacity the driver sets it and
  # lowers min_size to go below it (to 0 when the job ends). An apply must not put them back.
  lifecycle {
    ignore_changes = [desired_capacity, min_size]

    precondition {
      condition     = var.min_size <= var.desired_capacity && var.desired_capacity <= var.max_size
      error_message = "Need min_size <= desired_capacity <= max_size."
    }
  }

  # The rules and the queue policy first, so that no notice of the first instances is lost.
  # The GPU role's policy, so that the first instances can read the release.
  depends_on = [aws_cloudwatch_event_target.notices, aws_sqs_queue_policy.notices, aws_iam_role_policy.gpu_release]
}

# --- The on-demand fallback group (on_demand_fallback) ---

# What the job falls back on while spot is out: the spot group's launch template (same image,
# cloud-init and agent, joining the same driver), instance types and subnets, on-demand. It
# stays at zero, and costs nothing, until the driver grows it by the hosts missing; the driver
# sets it back to zero once the job has moved back to spot.
resource "aws_autoscaling_group" "fallback" {
  count = var.on_demand_fallback ? 1 : 0

  name                = local.fallback_asg_name
  min_size            = 0
  max_size            = coalesce(var.fallback_max_size, var.max_size)
  desired_capacity    = 0
  vpc_zone_identifier = var.gpu_subnet_ids

  # On-demand only: every instance above a base of none is on-demand, in the order of
  # gpu_instance_types. (The launch template has no market options: the spot group gets spot
  # from its own instances_distribution.)
  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = 0
      on_demand_percentage_above_base_capacity = 100
      on_demand_allocation_strategy            = "prioritized"
    }

    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.gpu.id
        version            = aws_launch_template.gpu.latest_version
      }

      dynamic "override" {
        for_each = var.gpu_instance_types

        content {
          instance_type = override.value
        }
      }
    }
  }

  # As the spot group: a new launch template version replaces the instances.
  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage = 0
    }
  }

  # No terminate lifecycle hook: the driver reads no notice queue for this group, so nothing
  # would complete it. It moves the workers off before it shrinks the group or hands an
  # instance back.

  dynamic "tag" {
    for_each = merge(local.tags, { Name = local.fallback_asg_name })

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  # The size is the driver's, as the spot group's: it grows and shrinks the group, and an
  # apply must not put it back.
  lifecycle {
    ignore_changes = [desired_capacity, min_size]
  }

  # The same as the spot group's first instances: the GPU role's policy, to read the release.
  depends_on = [aws_cloudwatch_event_target.notices, aws_sqs_queue_policy.notices, aws_iam_role_policy.gpu_release]
}
