# EFS: the browser profiles (profiles/) and the locks (locks/) the nodes share,
# under /gridfleet, reached through one access point. Only the nodes mount it:
# the hub never does.

resource "aws_efs_file_system" "main" {
  creation_token   = var.name_prefix
  encrypted        = true
  kms_key_id       = aws_kms_key.main.arn
  performance_mode = "generalPurpose"
  throughput_mode  = "elastic"

  lifecycle_policy {
    transition_to_ia = "AFTER_30_DAYS"
  }

  lifecycle_policy {
    transition_to_primary_storage_class = "AFTER_1_ACCESS"
  }

  tags = { Name = "${var.name_prefix}-shared" }
}

resource "aws_efs_backup_policy" "main" {
  file_system_id = aws_efs_file_system.main.id

  backup_policy {
    status = "ENABLED"
  }
}

resource "aws_efs_mount_target" "private" {
  for_each = aws_subnet.private

  file_system_id  = aws_efs_file_system.main.id
  subnet_id       = each.value.id
  security_groups = [aws_security_group.efs.id]
}

# A node's agent, Grid node and Chromium run as the crawl user (fleet.yaml
# fleet.crawl_uid = var.crawl_uid): every request through the access point is
# made as that user, whatever the client's own identity, and the directory EFS
# creates for it is that user's (0750: its group may read, others nothing).
resource "aws_efs_access_point" "main" {
  file_system_id = aws_efs_file_system.main.id

  posix_user {
    uid = var.crawl_uid
    gid = var.crawl_uid
  }

  root_directory {
    path = "/gridfleet"

    creation_info {
      owner_uid   = var.crawl_uid
      owner_gid   = var.crawl_uid
      permissions = "0750"
    }
  }

  tags = { Name = "${var.name_prefix}-shared" }
}

data "aws_iam_policy_document" "efs" {
  statement {
    sid       = "DenyWithoutTls"
    effect    = "Deny"
    actions   = ["elasticfilesystem:*"]
    resources = [aws_efs_file_system.main.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  # The nodes, through the access point only. No ClientRootAccess: the access
  # point's POSIX user is the crawl user, never root.
  statement {
    sid    = "NodesMountThroughAccessPoint"
    effect = "Allow"
    actions = [
      "elasticfilesystem:ClientMount",
      "elasticfilesystem:ClientWrite",
    ]
    resources = [aws_efs_file_system.main.arn]

    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.node.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [aws_efs_access_point.main.arn]
    }

    condition {
      test     = "Bool"
      variable = "elasticfilesystem:AccessedViaMountTarget"
      values   = ["true"]
    }
  }
}

resource "aws_efs_file_system_policy" "main" {
  file_system_id = aws_efs_file_system.main.id
  policy         = data.aws_iam_policy_document.efs.json
}
