# Schedules. There is no spot-interruption rule: each node watches its own
# instance metadata for the two-minute spot notice and hands its site back.

resource "aws_cloudwatch_event_rule" "start" {
  name                = "${var.name_prefix}-start"
  description         = "gridfleet: start the day's run (the starter Lambda)"
  schedule_expression = var.start_schedule
}

resource "aws_cloudwatch_event_target" "start" {
  rule      = aws_cloudwatch_event_rule.start.name
  target_id = "starter"
  arn       = aws_lambda_function.starter.arn

  retry_policy {
    maximum_event_age_in_seconds = 3600
    maximum_retry_attempts       = 5
  }
}

resource "aws_lambda_permission" "start" {
  statement_id  = "AllowStartSchedule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.starter.function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.start.arn
}

resource "aws_cloudwatch_event_rule" "watchdog" {
  name                = "${var.name_prefix}-watchdog"
  description         = "gridfleet: watchdog pass (restart a silent hub, terminate orphans)"
  schedule_expression = var.watchdog_schedule
}

resource "aws_cloudwatch_event_target" "watchdog" {
  rule      = aws_cloudwatch_event_rule.watchdog.name
  target_id = "watchdog"
  arn       = aws_lambda_function.watchdog.arn

  # The next pass comes two minutes later: a late one is worth nothing.
  retry_policy {
    maximum_event_age_in_seconds = 120
    maximum_retry_attempts       = 0
  }
}

resource "aws_lambda_permission" "watchdog" {
  statement_id  = "AllowWatchdogSchedule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.watchdog.function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.watchdog.arn
}
