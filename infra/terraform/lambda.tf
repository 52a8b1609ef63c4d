# The starter (daily) and the watchdog (every 2 minutes). Their code is the
# Lambda package `gridfleet bundle --upload` puts at bundle/gridfleet-lambda.zip;
# the functions are pinned to the object's current version, so a new upload
# goes live with the next `terraform apply`.

locals {
  lambda_zip_key = "bundle/gridfleet-lambda.zip"

  lambdas = {
    starter = {
      name    = local.starter_name
      handler = "lambdas.starter.handler"
    }
    watchdog = {
      name    = local.watchdog_name
      handler = "lambdas.watchdog.handler"
    }
  }

  # GRIDFLEET_STACK: the Lambdas act only on instances tagged gridfleet:stack with it.
  # GRIDFLEET_BUCKET: where the watchdog puts the summary of a run it closes.
  # GRIDFLEET_NOTIFY_TOPIC_ARN: where the watchdog says it closed one (notify.tf).
  lambda_environment = {
    GRIDFLEET_REGION              = var.region
    GRIDFLEET_STACK               = var.name_prefix
    GRIDFLEET_TABLE               = aws_dynamodb_table.status.name
    GRIDFLEET_BUCKET              = aws_s3_bucket.results.id
    GRIDFLEET_HUB_LAUNCH_TEMPLATE = aws_launch_template.hub.name
    GRIDFLEET_HUB_STALE_S         = tostring(var.hub_stale_s)
    GRIDFLEET_RUN_GRACE_S         = tostring(var.run_grace_s)
    GRIDFLEET_LOOKBACK_RUNS       = tostring(var.lookback_runs)
    GRIDFLEET_NOTIFY_TOPIC_ARN    = local.notify_topic_arn
  }

  # A reusable hub (var.hub_instance_id), started instead of a hub from the template.
  reusable_hub_environment = var.hub_instance_id == null ? {} : { GRIDFLEET_HUB_INSTANCE_ID = var.hub_instance_id }
}

data "aws_s3_object" "lambda_zip" {
  bucket = aws_s3_bucket.results.id
  key    = local.lambda_zip_key
}

# Failed asynchronous invocations (after Lambda's two retries) land here.
resource "aws_sqs_queue" "lambda_dlq" {
  for_each = local.lambdas

  name                      = "${each.value.name}-dlq"
  message_retention_seconds = 1209600 # 14 days
  # SQS-managed encryption: the functions send here without a KMS permission.
  sqs_managed_sse_enabled = true

  tags = { Name = "${each.value.name}-dlq" }
}

resource "aws_lambda_function" "starter" {
  #checkov:skip=CKV_AWS_117:The function only calls AWS APIs. Inside the VPC it would depend on the single NAT instance, and the watchdog must keep working when the fleet's network does not.
  #checkov:skip=CKV_AWS_272:The package is built and uploaded by `gridfleet bundle --upload` to a bucket only the deployers write to; the bundle the hub and nodes run from is not signed either, so signing this one would add a signing profile without closing the path.
  function_name = local.starter_name
  description   = "gridfleet: starts the hub of the day's run"
  role          = aws_iam_role.starter.arn
  runtime       = "python3.11"
  handler       = local.lambdas.starter.handler
  timeout       = 60
  memory_size   = 256

  s3_bucket         = aws_s3_bucket.results.id
  s3_key            = local.lambda_zip_key
  s3_object_version = data.aws_s3_object.lambda_zip.version_id

  reserved_concurrent_executions = var.lambda_reserved_concurrency
  kms_key_arn                    = aws_kms_key.main.arn

  environment {
    variables = merge(local.lambda_environment, local.reusable_hub_environment)
  }

  tracing_config {
    mode = "Active"
  }

  dead_letter_config {
    target_arn = aws_sqs_queue.lambda_dlq["starter"].arn
  }

  depends_on = [aws_cloudwatch_log_group.this, aws_iam_role_policy.starter]
}

resource "aws_lambda_function" "watchdog" {
  #checkov:skip=CKV_AWS_117:The function only calls AWS APIs. Inside the VPC it would depend on the single NAT instance, and the watchdog must keep working when the fleet's network does not.
  #checkov:skip=CKV_AWS_272:The package is built and uploaded by `gridfleet bundle --upload` to a bucket only the deployers write to; the bundle the hub and nodes run from is not signed either, so signing this one would add a signing profile without closing the path.
  function_name = local.watchdog_name
  description   = "gridfleet: restarts a silent hub, terminates orphaned instances"
  role          = aws_iam_role.watchdog.arn
  runtime       = "python3.11"
  handler       = local.lambdas.watchdog.handler
  timeout       = 60
  memory_size   = 256

  s3_bucket         = aws_s3_bucket.results.id
  s3_key            = local.lambda_zip_key
  s3_object_version = data.aws_s3_object.lambda_zip.version_id

  reserved_concurrent_executions = var.lambda_reserved_concurrency
  kms_key_arn                    = aws_kms_key.main.arn

  environment {
    variables = merge(local.lambda_environment, local.reusable_hub_environment)
  }

  tracing_config {
    mode = "Active"
  }

  dead_letter_config {
    target_arn = aws_sqs_queue.lambda_dlq["watchdog"].arn
  }

  depends_on = [aws_cloudwatch_log_group.this, aws_iam_role_policy.watchdog]
}
