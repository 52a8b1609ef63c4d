terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 5.8 adds `insecure_value` to the aws_ssm_parameter data source (the AMI id).
      version = "~> 5.8"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, {
      "gridfleet:stack" = var.name_prefix
      "ManagedBy"       = "terraform"
    })
  }
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = var.region

  # ARN prefixes the policies build on.
  ec2_arn  = "arn:${local.partition}:ec2:${local.region}:${local.account_id}"
  logs_arn = "arn:${local.partition}:logs:${local.region}:${local.account_id}"

  # A FIFO queue's name ends in .fifo, and so does its DLQ's (a FIFO queue's DLQ must be FIFO too).
  queue_name = var.queue_fifo ? "${trimsuffix(var.queue_name, ".fifo")}.fifo" : var.queue_name
  dlq_name   = var.queue_fifo ? "${trimsuffix(var.queue_name, ".fifo")}-dlq.fifo" : "${var.queue_name}-dlq"

  # Names the launch templates, the Lambdas and the log groups share.
  hub_template_name  = "${var.name_prefix}-hub"
  node_template_name = "${var.name_prefix}-node"
  starter_name       = "${var.name_prefix}-starter"
  watchdog_name      = "${var.name_prefix}-watchdog"

  # Variable defaults cannot refer to path.module: an empty value means the
  # file rendered next to this configuration.
  hub_user_data_file = coalesce(var.hub_user_data_file, "${path.module}/hub-user-data.yaml")

  # The tags gridfleet puts on the instances it launches and reads back. Every
  # instance of the stack carries gridfleet:stack = var.name_prefix (fleet.yaml
  # aws.stack); the policies act only on instances that carry it.
  tag_role   = "gridfleet:role"
  tag_run_id = "gridfleet:run_id"
  tag_stack  = "gridfleet:stack"
}
