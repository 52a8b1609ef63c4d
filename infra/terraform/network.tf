# The fleet's network: a VPC with a public and a private subnet per availability
# zone. The hub and the nodes live in the private subnets and reach the internet
# through one NAT instance, so every crawled site sees the same egress address
# (the NAT's Elastic IP). Nothing accepts connections from the internet.

locals {
  az_index = { for i, az in var.azs : az => i }
}

resource "aws_vpc" "main" {
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true # EFS mount target names resolve through the VPC resolver

  tags = { Name = var.name_prefix }
}

# No rules at all: nothing may fall back on the default security group.
resource "aws_default_security_group" "default" {
  vpc_id = aws_vpc.main.id

  tags = { Name = "${var.name_prefix}-default-unused" }
}

resource "aws_internet_gateway" "main" {
  vpc_id = aws_vpc.main.id

  tags = { Name = var.name_prefix }
}

resource "aws_subnet" "public" {
  for_each = local.az_index

  vpc_id                  = aws_vpc.main.id
  availability_zone       = each.key
  cidr_block              = cidrsubnet(var.vpc_cidr, 8, each.value)
  map_public_ip_on_launch = false # the NAT instance gets an Elastic IP; nothing else runs here

  tags = { Name = "${var.name_prefix}-public-${each.key}" }

  lifecycle {
    precondition {
      condition     = startswith(each.key, var.region)
      error_message = "Availability zone ${each.key} is not in region ${var.region}: set azs for the region."
    }
  }
}

resource "aws_subnet" "private" {
  for_each = local.az_index

  vpc_id                  = aws_vpc.main.id
  availability_zone       = each.key
  cidr_block              = cidrsubnet(var.vpc_cidr, 4, each.value + 1)
  map_public_ip_on_launch = false

  tags = { Name = "${var.name_prefix}-private-${each.key}" }
}

# --- routes ---------------------------------------------------------------------

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.main.id

  tags = { Name = "${var.name_prefix}-public" }
}

resource "aws_route" "public_default" {
  route_table_id         = aws_route_table.public.id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.main.id
}

resource "aws_route_table_association" "public" {
  for_each = aws_subnet.public

  subnet_id      = each.value.id
  route_table_id = aws_route_table.public.id
}

# One NAT instance serves every private subnet, so one private route table does too.
resource "aws_route_table" "private" {
  vpc_id = aws_vpc.main.id

  tags = { Name = "${var.name_prefix}-private" }
}

resource "aws_route" "private_default" {
  route_table_id         = aws_route_table.private.id
  destination_cidr_block = "0.0.0.0/0"
  network_interface_id   = aws_instance.nat.primary_network_interface_id
}

resource "aws_route_table_association" "private" {
  for_each = aws_subnet.private

  subnet_id      = each.value.id
  route_table_id = aws_route_table.private.id
}

# Gateway endpoints (free): S3 (results, bundle) and DynamoDB (every status
# write) bypass the NAT instance.
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.main.id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private.id]

  tags = { Name = "${var.name_prefix}-s3" }
}

resource "aws_vpc_endpoint" "dynamodb" {
  vpc_id            = aws_vpc.main.id
  service_name      = "com.amazonaws.${var.region}.dynamodb"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private.id]

  tags = { Name = "${var.name_prefix}-dynamodb" }
}

# --- the NAT instance -----------------------------------------------------------

data "aws_ssm_parameter" "ami" {
  name = var.ami_parameter
}

data "aws_ami" "base" {
  filter {
    name   = "image-id"
    values = [data.aws_ssm_parameter.ami.insecure_value]
  }
}

# The nodes' image: a baked node image (infra/packer) when node_ami_parameter names one, else the same.
data "aws_ssm_parameter" "node_ami" {
  name = local.node_ami_parameter
}

data "aws_ami" "node" {
  filter {
    name   = "image-id"
    values = [data.aws_ssm_parameter.node_ami.insecure_value]
  }
}

# The hubs' image: hub_ami_parameter (a baked node image serves a hub too) when set, else the same.
data "aws_ssm_parameter" "hub_ami" {
  name = local.hub_ami_parameter
}

data "aws_ami" "hub" {
  filter {
    name   = "image-id"
    values = [data.aws_ssm_parameter.hub_ami.insecure_value]
  }
}

locals {
  ami_id                = data.aws_ami.base.id
  root_device_name      = data.aws_ami.base.root_device_name
  node_ami_parameter    = coalesce(var.node_ami_parameter, var.ami_parameter)
  node_ami_id           = data.aws_ami.node.id
  node_root_device_name = data.aws_ami.node.root_device_name
  hub_ami_parameter     = coalesce(var.hub_ami_parameter, var.ami_parameter)
  hub_ami_id            = data.aws_ami.hub.id
  hub_root_device_name  = data.aws_ami.hub.root_device_name

  # Runs at every boot (a systemd unit), not only the first: forwarding and the
  # masquerade rule survive a stop and start of the instance.
  nat_user_data = <<-EOT
    #!/bin/bash
    set -euo pipefail
    cat > /usr/local/sbin/gridfleet-nat <<'SCRIPT'
    #!/bin/bash
    set -euo pipefail
    sysctl -q -w net.ipv4.ip_forward=1
    sysctl -q -w net.ipv4.conf.all.send_redirects=0
    iface=$(ip -4 route show default | awk '{print $5; exit}')
    iptables -t nat -C POSTROUTING -s ${var.vpc_cidr} -o "$iface" -j MASQUERADE 2>/dev/null ||
      iptables -t nat -A POSTROUTING -s ${var.vpc_cidr} -o "$iface" -j MASQUERADE
    SCRIPT
    chmod 0755 /usr/local/sbin/gridfleet-nat
    cat > /etc/sysctl.d/90-gridfleet-nat.conf <<'SYSCTL'
    net.ipv4.ip_forward = 1
    net.ipv4.conf.all.send_redirects = 0
    SYSCTL
    # The Elastic IP is attached shortly after boot: retry until apt can reach the mirror.
    for attempt in $(seq 1 30); do
      if command -v iptables >/dev/null; then break; fi
      if apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables; then break; fi
      echo "installing iptables failed (attempt $attempt); retrying in 10 s" >&2
      sleep 10
    done
    cat > /etc/systemd/system/gridfleet-nat.service <<'UNIT'
    [Unit]
    Description=gridfleet NAT: IP forwarding and masquerading for the private subnets
    After=network-online.target
    Wants=network-online.target

    [Service]
    Type=oneshot
    ExecStart=/usr/local/sbin/gridfleet-nat
    RemainAfterExit=yes

    [Install]
    WantedBy=multi-user.target
    UNIT
    systemctl daemon-reload
    systemctl enable --now gridfleet-nat.service
  EOT
}

resource "aws_instance" "nat" {
  #checkov:skip=CKV2_AWS_41:The NAT instance calls no AWS API; an instance profile would only put credentials on the host that forwards every node's traffic.
  ami                    = local.ami_id
  instance_type          = var.nat_instance_type
  subnet_id              = aws_subnet.public[var.azs[0]].id
  vpc_security_group_ids = [aws_security_group.nat.id]
  source_dest_check      = false # it forwards traffic that is neither from nor to itself
  ebs_optimized          = true
  monitoring             = true

  user_data                   = local.nat_user_data
  user_data_replace_on_change = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = 8
    encrypted             = true
    kms_key_id            = aws_kms_key.main.arn
    delete_on_termination = true
  }

  tags = { Name = "${var.name_prefix}-nat" }

  lifecycle {
    # A newer AMI behind the parameter must not replace the running NAT.
    ignore_changes = [ami]
  }
}

resource "aws_eip" "nat" {
  domain   = "vpc"
  instance = aws_instance.nat.id

  tags = { Name = "${var.name_prefix}-nat" }

  depends_on = [aws_internet_gateway.main]
}

# --- flow logs ------------------------------------------------------------------

resource "aws_flow_log" "vpc" {
  vpc_id                   = aws_vpc.main.id
  traffic_type             = "ALL"
  log_destination_type     = "cloud-watch-logs"
  log_destination          = aws_cloudwatch_log_group.this["flow"].arn
  iam_role_arn             = aws_iam_role.flow_logs.arn
  max_aggregation_interval = 600

  tags = { Name = "${var.name_prefix}-vpc" }
}
