# EFS: the browser profiles (profiles/) and the locks (locks/) the nodes share,
# under /gridfleet, reached through one access point.

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

# The node agent runs as root, so the access point does too; the directory it
# creates is readable by root only.
resource "aws_efs_access_point" "main" {
  file_system_id = aws_efs_file_system.main.id

  posix_user {
    uid = 0
    gid = 0
  }

  root_directory {
    path = "/gridfleet"

    creation_info {
      owner_uid   = 0
      owner_gid   = 0
      permissions = "0700"
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

  # The access point's POSIX user is root, and EFS applies an enforced root
  # identity only for clients allowed ClientRootAccess; without it they are
  # squashed to nobody and cannot enter the 0700 directory.
  statement {
    sid    = "FleetMountsThroughAccessPoint"
    effect = "Allow"
    actions = [
      "elasticfilesystem:ClientMount",
      "elasticfilesystem:ClientRootAccess",
      "elasticfilesystem:ClientWrite",
    ]
    resources = [aws_efs_file_system.main.arn]

    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.hub.arn, aws_iam_role.node.arn]
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
