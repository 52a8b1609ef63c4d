output "region" {
  description = "AWS region of the fleet."
  value       = var.region
}

output "table" {
  description = "DynamoDB table of the runs and sites."
  value       = aws_dynamodb_table.status.name
}

output "queue" {
  description = "SQS queue of the sites."
  value       = aws_sqs_queue.sites.name
}

output "dlq" {
  description = "Dead-letter queue of the site queue."
  value       = aws_sqs_queue.sites_dlq.name
}

output "bucket" {
  description = "S3 bucket of the results, the bundle and the configs."
  value       = aws_s3_bucket.results.id
}

output "efs_id" {
  description = "EFS file system of the profiles and locks."
  value       = aws_efs_file_system.main.id
}

output "private_subnet_ids" {
  description = "Private subnets, one per availability zone, in the order of var.azs."
  value       = [for az in var.azs : aws_subnet.private[az].id]
}

output "node_security_group_ids" {
  description = "Security groups of the nodes."
  value       = [aws_security_group.node.id]
}

output "node_instance_profile" {
  description = "Instance profile of the nodes."
  value       = aws_iam_instance_profile.node.name
}

output "hub_instance_profile" {
  description = "Instance profile of the hub."
  value       = aws_iam_instance_profile.hub.name
}

output "ami_parameter" {
  description = "SSM parameter of the AMI."
  value       = var.ami_parameter
}

output "node_ami_parameter" {
  description = "SSM parameter of the nodes' AMI (a baked node image, or ami_parameter)."
  value       = local.node_ami_parameter
}

output "node_launch_template" {
  description = "Name of the node launch template."
  value       = aws_launch_template.node.name
}

output "hub_launch_template" {
  description = "Name of the hub launch template."
  value       = aws_launch_template.hub.name
}

output "nat_public_ip" {
  description = "The fleet's single egress address: every crawled site sees this IP."
  value       = aws_eip.nat.public_ip
}

output "hub_log_group" {
  description = "CloudWatch Logs group of the hubs' logs, one stream per instance (<run id>/<instance id>): /<name_prefix>/hub, as gridfleet derives it from aws.stack."
  value       = aws_cloudwatch_log_group.this["hub"].name
}

output "node_log_group" {
  description = "CloudWatch Logs group of the nodes' logs, one stream per instance (<run id>/<instance id>): /<name_prefix>/node, as gridfleet derives it from aws.stack."
  value       = aws_cloudwatch_log_group.this["node"].name
}

output "alarms_topic_arn" {
  description = "SNS topic of the alarms."
  value       = aws_sns_topic.alarms.arn
}

output "notify_topic_arn" {
  description = "SNS topic of the end-of-run messages: fleet.yaml's notify.sns_topic_arn."
  value       = local.notify_topic_arn
}

# Exactly the keys of fleet.yaml's aws: section this stack decides.
# `terraform output -json | gridfleet config from-terraform > aws.yaml` reads it.
output "gridfleet_aws" {
  description = "The aws: section of fleet.yaml for this stack (read by `gridfleet config from-terraform`)."
  value = {
    region               = var.region
    stack                = var.name_prefix
    table                = aws_dynamodb_table.status.name
    queue                = aws_sqs_queue.sites.name
    queue_fifo           = aws_sqs_queue.sites.fifo_queue
    dlq                  = aws_sqs_queue.sites_dlq.name
    bucket               = aws_s3_bucket.results.id
    efs_id               = aws_efs_file_system.main.id
    subnet_ids           = [for az in var.azs : aws_subnet.private[az].id]
    security_group_ids   = [aws_security_group.node.id]
    instance_profile     = aws_iam_instance_profile.node.name
    ami                  = var.ami_parameter
    node_ami             = local.node_ami_parameter
    key_name             = var.key_name
    node_launch_template = aws_launch_template.node.name
    hub_launch_template  = aws_launch_template.hub.name
  }
}
