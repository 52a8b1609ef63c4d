# EFS: each site's browser profile and its lock, in a directory of that site
# alone (/gridfleet/sites/<site>), reached through the site's own access point.
# The hub makes those access points at the start of a run (fleet/aws/efs.py:
# tagged gridfleet:stack and gridfleet:site, POSIX user the crawl user, the
# directory created as that user's, 0700) and never mounts; a node's root helper
# mounts the one of the site the node claims, for that crawl (node/site_mounts.py).
# Terraform makes none: sites come and go with the config.

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

# Every access point of the file system, as IAM's elasticfilesystem:AccessPointArn
# names them: an access point's ARN does not name its file system, but a mount of
# this file system (the resource) can only go through one of its own.
locals {
  efs_access_point_arns = "arn:${local.partition}:elasticfilesystem:${local.region}:${local.account_id}:access-point/*"
  tag_site              = "gridfleet:site" # fleet/record/tags.py TAG_SITE: the site a site's access point is of
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

  # The nodes, through an access point only (a site's: the only ones the stack
  # makes), never the file system's root. No ClientRootAccess: every site's access
  # point has the crawl user as its POSIX user, never root. ClientMount and
  # ClientWrite take no tag condition (the Service Authorization Reference lists
  # only AccessPointArn and AccessedViaMountTarget for them), so IAM cannot tell
  # one site's access point from another's: the node's root helper does.
  statement {
    sid    = "NodesMountThroughSiteAccessPoints"
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
      test     = "ArnLike"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [local.efs_access_point_arns]
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
