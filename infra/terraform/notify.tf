# The topic of the end-of-run messages (fleet.yaml's notify.sns_topic_arn): the
# hub publishes one when a run ends, the watchdog one when it ends an overdue
# run. Subscribe to it what should hear of runs (e-mail, a chat integration, a
# queue). var.notify_topic_arn names an existing topic instead of this one.

resource "aws_sns_topic" "runs" {
  count = var.notify_topic_arn == null ? 1 : 0

  name = "${var.name_prefix}-runs"
  # The AWS-managed key: its key policy lets the account's principals use it through
  # SNS, so the hub and the watchdog publish with sns:Publish alone.
  kms_master_key_id = "alias/aws/sns"

  tags = { Name = "${var.name_prefix}-runs" }
}

locals {
  notify_topic_arn = coalesce(var.notify_topic_arn, one(aws_sns_topic.runs[*].arn))
}
