# Launch templates. The Lambdas launch the hub from its template by name; the
# hub launches nodes from theirs (fleet.yaml aws.node_launch_template), setting
# the instance type, subnet, market (spot or on-demand) and user-data per launch.

locals {
  launch_tags = { (local.tag_stack) = var.name_prefix }
}

resource "aws_launch_template" "hub" {
  name                   = local.hub_template_name
  description            = "gridfleet hub: Selenium Grid hub and the orchestrator"
  image_id               = local.hub_ami_id # hub_ami_parameter's image, else the stack's
  instance_type          = var.hub_instance_type
  update_default_version = true

  # The starter launches a new hub from this template for every run, and the
  # hub's last act is `shutdown -h`: a hub from the template ends with its run,
  # leaving no stopped instance or volume behind. (A reusable hub, the Lambdas'
  # GRIDFLEET_HUB_INSTANCE_ID, is the operator's own instance and keeps its own
  # shutdown behaviour, stop.)
  instance_initiated_shutdown_behavior = "terminate"

  # Rendered by `gridfleet render hub --config fleet.yaml > infra/terraform/hub-user-data.yaml`.
  user_data = filebase64(local.hub_user_data_file)

  iam_instance_profile {
    name = aws_iam_instance_profile.hub.name
  }

  # RunInstances from the Lambdas names only the template: it carries the subnet.
  network_interfaces {
    device_index                = 0
    subnet_id                   = aws_subnet.private[var.azs[0]].id
    security_groups             = [aws_security_group.hub.id]
    associate_public_ip_address = false
    delete_on_termination       = true
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "enabled" # the hub reads its gridfleet:run_id tag from IMDS
  }

  block_device_mappings {
    device_name = local.hub_root_device_name

    ebs {
      volume_type           = "gp3"
      volume_size           = var.hub_volume_size_gb
      encrypted             = true
      kms_key_id            = aws_kms_key.main.arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.launch_tags, { (local.tag_role) = "hub", Name = "${var.name_prefix}-hub" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.launch_tags, { (local.tag_role) = "hub", Name = "${var.name_prefix}-hub" })
  }

  tags = { Name = local.hub_template_name }
}

resource "aws_launch_template" "node" {
  name                   = local.node_template_name
  description            = "gridfleet node: Selenium Grid node and Chromium"
  image_id               = local.node_ami_id # a baked node image (node_ami_parameter), else the stack's
  instance_type          = var.node_instance_type
  key_name               = var.key_name
  update_default_version = true

  # A node's last act is to shut itself down, which ends it.
  instance_initiated_shutdown_behavior = "terminate"

  # No user_data: the hub renders it at each launch (run id, hub address).

  iam_instance_profile {
    name = aws_iam_instance_profile.node.name
  }

  vpc_security_group_ids = [aws_security_group.node.id]

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = local.node_root_device_name

    ebs {
      volume_type           = "gp3"
      volume_size           = var.node_volume_size_gb
      encrypted             = true
      kms_key_id            = aws_kms_key.main.arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.launch_tags, { (local.tag_role) = "node" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.launch_tags, { (local.tag_role) = "node" })
  }

  tags = { Name = local.node_template_name }
}
