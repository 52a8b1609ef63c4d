# The run's state (DynamoDB) and its work queue (SQS).

resource "aws_dynamodb_table" "status" {
  name         = var.table_name
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "run_id"
  range_key    = "Site"

  attribute {
    name = "run_id"
    type = "S"
  }

  attribute {
    name = "Site"
    type = "S"
  }

  # Set (to the site id) only while a site is QUEUED or RUN: the sort key of the index below.
  attribute {
    name = "openSite"
    type = "S"
  }

  # The sparse index of the sites that can still change, with the attributes of their stamps
  # (fleet.record.codec.item_stamp): the hub's per-tick read of what moved. Local, so that read can be
  # strongly consistent; a local index exists only if the table is created with it.
  local_secondary_index {
    name               = "open"
    range_key          = "openSite"
    projection_type    = "INCLUDE"
    non_key_attributes = ["attemptCount", "instance_id", "run_status", "kill_reason", "version", "site_status",
    "lastUpdateEpoch", "heartbeatEpoch", "enqueued", "pages", "url"]
  }

  # Items carry expireAt = run end + aws.result_ttl_days.
  ttl {
    attribute_name = "expireAt"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = aws_kms_key.main.arn
  }

  deletion_protection_enabled = true

  tags = { Name = var.table_name }
}

# A site message moves here after max_receive_count receives without a delete.
resource "aws_sqs_queue" "sites_dlq" {
  name                              = local.dlq_name
  fifo_queue                        = var.queue_fifo
  content_based_deduplication       = false
  message_retention_seconds         = 1209600 # 14 days, the SQS maximum
  kms_master_key_id                 = aws_kms_key.main.arn
  kms_data_key_reuse_period_seconds = 3600

  tags = { Name = local.dlq_name }
}

resource "aws_sqs_queue" "sites" {
  name = local.queue_name
  # FIFO (var.queue_fifo): the senders give each message a deduplication id of
  # its (run, site, attempt) and a message group per site; never by content.
  fifo_queue                  = var.queue_fifo
  content_based_deduplication = false
  # The node heartbeat timeout: a node extends the visibility of the message it
  # works on while it is alive; a silent node's message comes back after 90 s.
  visibility_timeout_seconds        = 90
  message_retention_seconds         = 345600 # 4 days
  kms_master_key_id                 = aws_kms_key.main.arn
  kms_data_key_reuse_period_seconds = 3600

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.sites_dlq.arn
    maxReceiveCount     = var.max_receive_count
  })

  tags = { Name = local.queue_name }
}

# Only the site queue may use the DLQ as its dead-letter queue.
resource "aws_sqs_queue_redrive_allow_policy" "sites_dlq" {
  queue_url = aws_sqs_queue.sites_dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.sites.arn]
  })
}
