# Logs, the dashboard and the alarms.

locals {
  # Named after the stack, so that stacks share an account and region. gridfleet
  # derives the hub's and the nodes' from aws.stack (/<stack>/hub, /<stack>/node),
  # the stream of each instance being <run id>/<instance id>.
  log_groups = {
    starter  = "/aws/lambda/${local.starter_name}"
    watchdog = "/aws/lambda/${local.watchdog_name}"
    hub      = "/${var.name_prefix}/hub"
    node     = "/${var.name_prefix}/node"
    flow     = "/${var.name_prefix}/vpc-flow-logs"
  }
}

resource "aws_cloudwatch_log_group" "this" {
  #checkov:skip=CKV_AWS_338:Retention is log_retention_days (default 30): these are operational logs of a daily crawl, and a year of VPC flow logs and node logs costs far more than it is worth; raise the variable where an audit needs it.
  for_each = local.log_groups

  name              = each.value
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.main.arn

  tags = { Name = each.value }
}

# --- VPC flow logs' delivery role -------------------------------------------------

data "aws_iam_policy_document" "flow_logs_trust" {
  statement {
    sid     = "FlowLogsAssumeRole"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["${local.ec2_arn}:vpc-flow-log/*"]
    }
  }
}

resource "aws_iam_role" "flow_logs" {
  name               = "${var.name_prefix}-vpc-flow-logs"
  description        = "VPC flow logs delivery to CloudWatch Logs"
  assume_role_policy = data.aws_iam_policy_document.flow_logs_trust.json
}

data "aws_iam_policy_document" "flow_logs" {
  # VPC flow logs: the delivery into the flow log group.
  statement {
    sid = "DeliverFlowLogs"
    actions = [
      "logs:CreateLogStream",
      "logs:DescribeLogStreams",
      "logs:PutLogEvents",
    ]
    resources = [
      aws_cloudwatch_log_group.this["flow"].arn,
      "${aws_cloudwatch_log_group.this["flow"].arn}:*",
    ]
  }

  # VPC flow logs: checks its destination exists. DescribeLogGroups has no
  # resource-level permissions.
  statement {
    sid       = "FindLogGroup"
    actions   = ["logs:DescribeLogGroups"]
    resources = ["*"]
  }
}

resource "aws_iam_role_policy" "flow_logs" {
  name   = "${var.name_prefix}-vpc-flow-logs"
  role   = aws_iam_role.flow_logs.id
  policy = data.aws_iam_policy_document.flow_logs.json
}

# --- alarms -----------------------------------------------------------------------

resource "aws_sns_topic" "alarms" {
  name              = "${var.name_prefix}-alarms"
  kms_master_key_id = aws_kms_key.main.arn

  tags = { Name = "${var.name_prefix}-alarms" }
}

resource "aws_sns_topic_subscription" "alarm_email" {
  count = var.alarm_email == null ? 0 : 1

  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = var.alarm_email
}

resource "aws_cloudwatch_metric_alarm" "queue_depth" {
  alarm_name          = "${var.name_prefix}-queue-depth"
  alarm_description   = "More than ${var.queue_depth_alarm_threshold} sites waiting in ${var.queue_name} for 30 minutes."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.sites.name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 6
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.queue_depth_alarm_threshold
  treat_missing_data  = "notBreaching"
  actions_enabled     = true
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

resource "aws_cloudwatch_metric_alarm" "run_overdue" {
  alarm_name          = "${var.name_prefix}-run-overdue"
  alarm_description   = "A site has waited in ${var.queue_name} for more than ${var.run_overdue_s} s: the run is overdue."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateAgeOfOldestMessage"
  dimensions          = { QueueName = aws_sqs_queue.sites.name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.run_overdue_s
  treat_missing_data  = "notBreaching" # no run, no messages, no metric
  actions_enabled     = true
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

resource "aws_cloudwatch_metric_alarm" "fleet_ceiling" {
  alarm_name          = "${var.name_prefix}-fleet-above-ceiling"
  alarm_description   = "The hub reports more than ${var.max_nodes} active nodes."
  namespace           = var.metrics_namespace
  metric_name         = "ActiveNodes"
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 3
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.max_nodes
  treat_missing_data  = "notBreaching" # the hub publishes only while a run is on
  actions_enabled     = true
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

# --- dashboard --------------------------------------------------------------------
# The metrics gridfleet publishes with metrics.cloudwatch on. The hub's, without
# dimensions: gauges (ActiveNodes, SitesQueued, SitesRunning, SitesCompleted,
# SitesFailed, RunProgress, QueueVisible, QueueInFlight, QueueDlq), the current
# value every metrics.interval_s, so read with Maximum (a Sum would add the same
# count up once per publish); and Kills, the kills since its last publish, also by
# KillPath. Each node's, by WorkerId (its instance id): JobDuration, JobsCompleted,
# JobErrors (also by ErrorType) and Heartbeat, drawn with SEARCH, which finds each
# node's series as it appears (a schema matches that exact set of dimensions).
# The hub's Queue* gauges are not drawn: the site queue widget reads the same
# depths from SQS, with or without a hub.

locals {
  # The namespace as the first term of a SEARCH schema, quoted: a namespace may hold hyphens.
  search_namespace = "\"${var.metrics_namespace}\""

  dashboard_widgets = [
    {
      title = "Site queue"
      stat  = "Maximum"
      metrics = [
        ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", aws_sqs_queue.sites.name, { label = "waiting" }],
        ["AWS/SQS", "ApproximateNumberOfMessagesNotVisible", "QueueName", aws_sqs_queue.sites.name, { label = "being crawled" }],
        ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", aws_sqs_queue.sites_dlq.name, { label = "dead-lettered" }],
      ]
    },
    {
      title   = "Active nodes"
      stat    = "Maximum"
      metrics = [[var.metrics_namespace, "ActiveNodes", { label = "active nodes" }]]
      annotations = {
        horizontal = [{ label = "max_nodes", value = var.max_nodes }]
      }
    },
    {
      title = "Sites by status"
      stat  = "Maximum"
      metrics = [
        [var.metrics_namespace, "SitesQueued", { label = "queued" }],
        [var.metrics_namespace, "SitesRunning", { label = "running" }],
        [var.metrics_namespace, "SitesCompleted", { label = "completed" }],
        [var.metrics_namespace, "SitesFailed", { label = "failed" }],
      ]
    },
    {
      title   = "Run progress (%)"
      stat    = "Maximum"
      metrics = [[var.metrics_namespace, "RunProgress", { label = "sites completed or failed" }]]
      yAxis   = { left = { min = 0, max = 100, showUnits = false } }
    },
    {
      title = "Items and pages"
      stat  = "Maximum"
      metrics = [
        [var.metrics_namespace, "ItemsCompleted", { label = "items of the completed sites' results" }],
        [var.metrics_namespace, "PagesFetched", { label = "pages fetched, retries included" }],
      ]
    },
    {
      title = "Items left out"
      stat  = "Maximum"
      metrics = [
        [var.metrics_namespace, "ItemCollisions", { label = "collisions (same id, other content)" }],
        [var.metrics_namespace, "ItemsSkipped", { label = "skipped (no id)" }],
      ]
    },
    {
      title = "Kills"
      stat  = "Sum"
      metrics = [
        [var.metrics_namespace, "Kills", { label = "kills" }],
        [{
          expression = "SEARCH('{${local.search_namespace},KillPath} MetricName=\"Kills\"', 'Sum', 300)"
          label      = "$${PROP('Dim.KillPath')}"
          id         = "e1"
        }],
      ]
    },
    {
      title = "Jobs completed per node"
      stat  = "Sum"
      metrics = [[{
        expression = "SEARCH('{${local.search_namespace},WorkerId} MetricName=\"JobsCompleted\"', 'Sum', 300)"
        label      = "$${PROP('Dim.WorkerId')}"
        id         = "e1"
      }]]
    },
    {
      title = "Job errors by type and node"
      stat  = "Sum"
      metrics = [[{
        expression = "SEARCH('{${local.search_namespace},ErrorType,WorkerId} MetricName=\"JobErrors\"', 'Sum', 300)"
        label      = "$${PROP('Dim.ErrorType')} on $${PROP('Dim.WorkerId')}"
        id         = "e1"
      }]]
    },
    {
      title = "Job duration per node (s, average)"
      stat  = "Average"
      metrics = [[{
        expression = "SEARCH('{${local.search_namespace},WorkerId} MetricName=\"JobDuration\"', 'Average', 300)"
        label      = "$${PROP('Dim.WorkerId')}"
        id         = "e1"
      }]]
    },
    {
      # One a minute from each live node: a line that stops is a node gone silent.
      title = "Node heartbeats"
      stat  = "Sum"
      metrics = [[{
        expression = "SEARCH('{${local.search_namespace},WorkerId} MetricName=\"Heartbeat\"', 'Sum', 300)"
        label      = "$${PROP('Dim.WorkerId')}"
        id         = "e1"
      }]]
    },
  ]
}

resource "aws_cloudwatch_dashboard" "fleet" {
  dashboard_name = var.name_prefix

  dashboard_body = jsonencode({
    widgets = [
      for i, w in local.dashboard_widgets : {
        type   = "metric"
        x      = (i % 2) * 12
        y      = floor(i / 2) * 6
        width  = 12
        height = 6
        properties = merge(
          {
            title   = w.title
            region  = var.region
            view    = "timeSeries"
            stacked = false
            period  = 300
            stat    = w.stat
            metrics = w.metrics
          },
          try({ annotations = w.annotations }, {}),
          try({ yAxis = w.yAxis }, {}),
        )
      }
    ]
  })
}
