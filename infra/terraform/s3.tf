# The results bucket. Besides the results (<site>/<run date>/result.json), with
# the evidence and checkpoint parts beside them, it
# holds the code bundle and the Lambda package (bundle/), the hub's config
# (hub/fleet.yaml, which only the hub may read) and each run's config (runs/<run id>/fleet.yaml).

locals {
  access_log_bucket = "${var.bucket_name}-access-logs"
}

resource "aws_s3_bucket" "results" {
  #checkov:skip=CKV_AWS_144:No cross-region replica: results are re-crawled daily and expire after result_retention_days; a second region would double storage and transfer for data that can be regenerated.
  bucket = var.bucket_name

  tags = { Name = var.bucket_name }

  lifecycle {
    precondition {
      condition     = length(var.bucket_name) <= 51
      error_message = "bucket_name: at most 51 characters (the access log bucket appends -access-logs)."
    }
  }
}

resource "aws_s3_bucket_ownership_controls" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "results" {
  bucket = aws_s3_bucket.results.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.main.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_versioning" "results" {
  bucket = aws_s3_bucket.results.id

  versioning_configuration {
    status = "Enabled"
  }
}

# Results are keyed <site>/<date>/result.json, with no common prefix, and the
# bundle and configs share the bucket: the hub tags every result and evidence
# file it stores gridfleet=result (fleet.aws.results.RESULT_TAG), and only tagged
# objects and what nodes write (under staging/) expire.
resource "aws_s3_bucket_lifecycle_configuration" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    id     = "expire-results"
    status = "Enabled"

    filter {
      tag {
        key   = "gridfleet"
        value = "result"
      }
    }

    expiration {
      days = var.result_retention_days
    }
  }

  # What nodes write (staging/<role id>:<instance id>/...: staged results, checkpoint parts, evidence; the node
  # role may write nowhere else and tags nothing): the hub copies results as they are saved and evidence when the
  # run ends, a retry within the run reads the parts, nothing reads any of it after the run.
  rule {
    id     = "expire-staging"
    status = "Enabled"

    filter {
      prefix = "staging/"
    }

    expiration {
      days = var.checkpoint_part_retention_days
    }
  }

  # Every object: old versions and abandoned uploads. (S3 does not allow an
  # abort rule with a tag filter, hence a rule of its own.)
  rule {
    id     = "housekeeping"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = 30
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  depends_on = [aws_s3_bucket_versioning.results]
}

# New results are announced on the account's default EventBridge bus, for
# whatever consumes them downstream.
resource "aws_s3_bucket_notification" "results" {
  bucket      = aws_s3_bucket.results.id
  eventbridge = true
}

resource "aws_s3_bucket_logging" "results" {
  bucket        = aws_s3_bucket.results.id
  target_bucket = aws_s3_bucket.access_logs.id
  target_prefix = "${var.bucket_name}/"
}

data "aws_iam_policy_document" "results_bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.results.arn, "${aws_s3_bucket.results.arn}/*"]

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
}

resource "aws_s3_bucket_policy" "results" {
  bucket = aws_s3_bucket.results.id
  policy = data.aws_iam_policy_document.results_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.results]
}

# --- server access logs of the results bucket -----------------------------------

resource "aws_s3_bucket" "access_logs" {
  #checkov:skip=CKV_AWS_18:This bucket receives the access logs; logging its own access would need a third bucket or a loop.
  #checkov:skip=CKV_AWS_144:No cross-region replica of the access logs: they are kept for investigation, a second copy doubles the cost.
  #checkov:skip=CKV_AWS_145:S3 server access logging only delivers to buckets encrypted with SSE-S3 (AES256); SSE-KMS is not supported for the target bucket.
  #checkov:skip=CKV2_AWS_62:S3 writes a log object every few minutes; event notifications for them would have no consumer.
  bucket = local.access_log_bucket

  tags = { Name = local.access_log_bucket }
}

resource "aws_s3_bucket_ownership_controls" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_versioning" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id

  rule {
    id     = "expire-access-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = var.result_retention_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 7
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  depends_on = [aws_s3_bucket_versioning.access_logs]
}

data "aws_iam_policy_document" "access_logs_bucket" {
  statement {
    sid       = "S3LogDeliveryWritesResultsBucketLogs"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.access_logs.arn}/${var.bucket_name}/*"]

    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = [aws_s3_bucket.results.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.access_logs.arn, "${aws_s3_bucket.access_logs.arn}/*"]

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
}

resource "aws_s3_bucket_policy" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  policy = data.aws_iam_policy_document.access_logs_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.access_logs]
}
