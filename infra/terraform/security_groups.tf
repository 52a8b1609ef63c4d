# Security groups. Rules are separate resources (one per port and peer), so that
# the hub and node groups can refer to each other. No rule admits traffic from
# the internet: the only ingress peers are the fleet's own groups and subnets.

locals {
  grid_ports = {
    grid    = 4444 # Grid router: sessions, /status
    publish = 4442 # event bus, publish
    sub     = 4443 # event bus, subscribe
  }
  web_ports = { http = 80, https = 443 }
}

resource "aws_security_group" "hub" {
  name        = "${var.name_prefix}-hub"
  description = "gridfleet hub: Selenium Grid hub and orchestrator"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${var.name_prefix}-hub" }
}

resource "aws_security_group" "node" {
  name        = "${var.name_prefix}-node"
  description = "gridfleet nodes: Selenium Grid node and Chromium"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${var.name_prefix}-node" }
}

resource "aws_security_group" "efs" {
  name        = "${var.name_prefix}-efs"
  description = "gridfleet EFS mount targets"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${var.name_prefix}-efs" }
}

resource "aws_security_group" "nat" {
  name        = "${var.name_prefix}-nat"
  description = "gridfleet NAT instance"
  vpc_id      = aws_vpc.main.id

  tags = { Name = "${var.name_prefix}-nat" }
}

# --- hub ------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "hub_grid_from_nodes" {
  for_each = local.grid_ports

  security_group_id            = aws_security_group.hub.id
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "Selenium Grid ${each.key} port from the nodes"
}

resource "aws_vpc_security_group_egress_rule" "hub_to_nodes_grid" {
  security_group_id            = aws_security_group.hub.id
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = 5555
  to_port                      = 5555
  description                  = "Selenium Grid node port: sessions and health checks"
}

resource "aws_vpc_security_group_egress_rule" "hub_to_nodes_ssh" {
  security_group_id            = aws_security_group.hub.id
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = 22
  to_port                      = 22
  description                  = "SSH to the nodes: the kill path after SSM"
}

resource "aws_vpc_security_group_egress_rule" "hub_web" {
  for_each = local.web_ports

  security_group_id = aws_security_group.hub.id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = each.value
  to_port           = each.value
  description       = "AWS APIs (443) and Debian package mirrors (80, 443)"
}

# --- nodes ----------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "node_grid_from_hub" {
  security_group_id            = aws_security_group.node.id
  referenced_security_group_id = aws_security_group.hub.id
  ip_protocol                  = "tcp"
  from_port                    = 5555
  to_port                      = 5555
  description                  = "Selenium Grid node port from the hub"
}

resource "aws_vpc_security_group_ingress_rule" "node_ssh_from_hub" {
  #checkov:skip=CKV_AWS_24:False positive: the check reads no referenced_security_group_id on this resource type and takes the rule for one without a source. The only source is the hub's security group; there is no CIDR.
  security_group_id            = aws_security_group.node.id
  referenced_security_group_id = aws_security_group.hub.id
  ip_protocol                  = "tcp"
  from_port                    = 22
  to_port                      = 22
  description                  = "SSH from the hub only (kill path)"
}

resource "aws_vpc_security_group_egress_rule" "node_to_hub_grid" {
  for_each = local.grid_ports

  security_group_id            = aws_security_group.node.id
  referenced_security_group_id = aws_security_group.hub.id
  ip_protocol                  = "tcp"
  from_port                    = each.value
  to_port                      = each.value
  description                  = "Selenium Grid ${each.key} port on the hub"
}

resource "aws_vpc_security_group_egress_rule" "node_to_efs" {
  security_group_id            = aws_security_group.node.id
  referenced_security_group_id = aws_security_group.efs.id
  ip_protocol                  = "tcp"
  from_port                    = 2049
  to_port                      = 2049
  description                  = "NFS to the EFS mount targets"
}

resource "aws_vpc_security_group_egress_rule" "node_web" {
  for_each = local.web_ports

  security_group_id = aws_security_group.node.id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = each.value
  to_port           = each.value
  description       = "The crawled sites, AWS APIs and package mirrors"
}

# --- EFS ------------------------------------------------------------------------
# The nodes alone mount the file system: the hub has no NFS path to it.

resource "aws_vpc_security_group_ingress_rule" "efs_from_nodes" {
  security_group_id            = aws_security_group.efs.id
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = 2049
  to_port                      = 2049
  description                  = "NFS from the nodes"
}

# --- NAT ------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "nat_from_private" {
  for_each = aws_subnet.private

  security_group_id = aws_security_group.nat.id
  cidr_ipv4         = each.value.cidr_block
  ip_protocol       = "-1"
  description       = "Everything the private subnet ${each.key} sends out"
}

# The NAT's egress carries the nodes' and the hub's traffic too (security groups
# apply to forwarded packets): the same two ports they may use.
resource "aws_vpc_security_group_egress_rule" "nat_web" {
  for_each = local.web_ports

  security_group_id = aws_security_group.nat.id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = each.value
  to_port           = each.value
  description       = "Forwarded web traffic and the NAT's own package updates"
}
