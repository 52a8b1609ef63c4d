# One customer managed key encrypts the fleet's data at rest: the table, the
# queues, the bucket, EFS, the EBS volumes, the log groups, the alarms topic and
# the Lambdas' environment.

locals {
  spot_service_role_arn = "arn:${local.partition}:iam::${local.account_id}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"

  # Principals that launch or start instances with volumes encrypted by the key.
  ebs_key_users = [
    aws_iam_role.hub.arn,
    aws_iam_role.starter.arn,
    aws_iam_role.watchdog.arn,
    local.spot_service_role_arn,
  ]
  ebs_key_actions = [
    "kms:Decrypt",
    "kms:DescribeKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
  ]
}

# Spot launches create their volumes through this service-linked role, which
# the key policy below must name (and KMS refuses a policy naming a missing role).
resource "aws_iam_service_linked_role" "spot" {
  count = var.create_spot_service_linked_role ? 1 : 0

  aws_service_name = "spot.amazonaws.com"
}

resource "aws_kms_key" "main" {
  description             = "gridfleet: data at rest of the fleet"
  enable_key_rotation     = true
  deletion_window_in_days = 30

  # A literal key policy (not an aws_iam_policy_document): the account statement
  # must keep kms:* on the key, as in the default key policy, or the key can
  # become unmanageable.
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "AccountAdministersKeyThroughIam"
        Effect    = "Allow"
        Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
        Action    = "kms:*"
        Resource  = "*"
      },
      {
        Sid       = "CloudWatchLogsEncryptsFleetLogGroups"
        Effect    = "Allow"
        Principal = { Service = "logs.${var.region}.amazonaws.com" }
        Action = [
          "kms:Decrypt",
          "kms:DescribeKey",
          "kms:Encrypt",
          "kms:GenerateDataKey",
          "kms:GenerateDataKeyWithoutPlaintext",
          "kms:ReEncryptFrom",
          "kms:ReEncryptTo",
        ]
        Resource = "*"
        Condition = {
          ArnLike = {
            "kms:EncryptionContext:aws:logs:arn" = "${local.logs_arn}:log-group:*"
          }
        }
      },
      {
        # CloudWatch alarms publish to the encrypted alarms topic; SNS itself
        # uses the key for the topic's messages. Both on this account's behalf
        # only: a service principal acts for every account.
        Sid       = "AlarmsPublishToEncryptedTopic"
        Effect    = "Allow"
        Principal = { Service = ["cloudwatch.amazonaws.com", "sns.amazonaws.com"] }
        Action    = ["kms:Decrypt", "kms:GenerateDataKey"]
        Resource  = "*"
        Condition = {
          StringEquals = { "aws:SourceAccount" = local.account_id }
        }
      },
      {
        # RunInstances and StartInstances create the encrypted EBS volumes with
        # the caller's (or the Spot service's) permissions.
        Sid       = "FleetLaunchersUseKeyForEbs"
        Effect    = "Allow"
        Principal = { AWS = local.ebs_key_users }
        Action    = local.ebs_key_actions
        Resource  = "*"
        Condition = {
          StringEquals = {
            "kms:ViaService"    = "ec2.${var.region}.amazonaws.com"
            "kms:CallerAccount" = local.account_id
          }
        }
      },
      {
        Sid       = "FleetLaunchersGrantKeyToEbs"
        Effect    = "Allow"
        Principal = { AWS = local.ebs_key_users }
        Action    = "kms:CreateGrant"
        Resource  = "*"
        Condition = {
          Bool = { "kms:GrantIsForAWSResource" = "true" }
        }
      },
    ]
  })

  depends_on = [aws_iam_service_linked_role.spot]
}

resource "aws_kms_alias" "main" {
  name          = "alias/${var.name_prefix}"
  target_key_id = aws_kms_key.main.key_id
}
