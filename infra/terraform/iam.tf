# IAM. Four roles run the fleet: the hub and the nodes (EC2), the starter and the
# watchdog (Lambda). Each has exactly one inline policy built from the policy
# document of the same name. Every action is spelled out; a resource is "*"
# only where the action has no resource-level permissions (said at the
# statement). Only the hub passes a role (the node role, to the nodes it
# launches) and only the Lambdas pass the hub role (to the hub they launch).
#
# Two stacks may share an account: every statement that acts on an existing
# instance (terminate, stop, start, tag, command, console) holds only for
# instances tagged gridfleet:stack = var.name_prefix, and every launch must tag
# its instance so.
#
# The hub and the nodes both run the SSM agent: their documents take its
# statements from data.aws_iam_policy_document.ssm_agent (source_policy_documents),
# so the two roles grant it the same, written once; each role still has one
# inline policy.

locals {
  instance_arns  = "${local.ec2_arn}:instance/*"
  volume_arns    = "${local.ec2_arn}:volume/*"
  eni_arns       = "${local.ec2_arn}:network-interface/*"
  spot_req_arns  = "${local.ec2_arn}:spot-instances-request/*"
  image_arns     = "arn:${local.partition}:ec2:${local.region}::image/*"
  private_subnet = [for s in aws_subnet.private : s.arn]
  key_pair_arns  = var.key_name == null ? [] : ["${local.ec2_arn}:key-pair/${var.key_name}"]

  queue_arns = [aws_sqs_queue.sites.arn, aws_sqs_queue.sites_dlq.arn]

  # The AMI parameters' ARNs. AWS's public parameters (/aws/service/...) belong to
  # no account, so their ARNs have none; a parameter of this account's (a baked
  # node image's, say /gridfleet/node-ami) has the account id in its ARN.
  ami_parameter_arns = distinct([
    for name in [var.ami_parameter, local.node_ami_parameter] :
    "arn:${local.partition}:ssm:${local.region}:${startswith(name, "/aws/service/") ? "" : local.account_id}:parameter${name}"
  ])

  # The streams of the hub's and the nodes' log groups (monitoring.tf): one per
  # instance, <run id>/<instance id>, made by whoever ships first.
  hub_log_streams  = "${aws_cloudwatch_log_group.this["hub"].arn}:log-stream:*"
  node_log_streams = "${aws_cloudwatch_log_group.this["node"].arn}:log-stream:*"

  # The Grid's secret: the hub puts it at each boot, the nodes read it (fleet.config.aws names it
  # /<stack>/grid-secret). SSM encrypts it with the stack's key, naming the parameter in the encryption context.
  grid_secret_arn = "arn:${local.partition}:ssm:${local.region}:${local.account_id}:parameter/${var.name_prefix}/grid-secret"

  # kms:ViaService values of the services that use the key on a role's behalf.
  via_dynamodb = "dynamodb.${local.region}.amazonaws.com"
  via_sqs      = "sqs.${local.region}.amazonaws.com"
  via_s3       = "s3.${local.region}.amazonaws.com"
  via_efs      = "elasticfilesystem.${local.region}.amazonaws.com"
  via_lambda   = "lambda.${local.region}.amazonaws.com"
  via_ssm      = "ssm.${local.region}.amazonaws.com"
}

# --- trust ----------------------------------------------------------------------

data "aws_iam_policy_document" "ec2_trust" {
  statement {
    sid     = "Ec2AssumesRole"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "lambda_trust" {
  statement {
    sid     = "LambdaAssumesRole"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "hub" {
  name               = "${var.name_prefix}-hub"
  description        = "gridfleet hub instance: runs the crawl, launches and kills nodes"
  assume_role_policy = data.aws_iam_policy_document.ec2_trust.json
}

resource "aws_iam_role" "node" {
  name               = "${var.name_prefix}-node"
  description        = "gridfleet node instances: crawl sites from the queue"
  assume_role_policy = data.aws_iam_policy_document.ec2_trust.json
}

resource "aws_iam_role" "starter" {
  name               = "${var.name_prefix}-starter"
  description        = "gridfleet starter Lambda: starts the day's hub"
  assume_role_policy = data.aws_iam_policy_document.lambda_trust.json
}

resource "aws_iam_role" "watchdog" {
  name               = "${var.name_prefix}-watchdog"
  description        = "gridfleet watchdog Lambda: restarts a silent hub, terminates orphans"
  assume_role_policy = data.aws_iam_policy_document.lambda_trust.json
}

resource "aws_iam_instance_profile" "hub" {
  name = "${var.name_prefix}-hub"
  role = aws_iam_role.hub.name
}

resource "aws_iam_instance_profile" "node" {
  name = "${var.name_prefix}-node"
  role = aws_iam_role.node.name
}

# --- the SSM agent, on the hub and the nodes ----------------------------------------
# Debian's images have no agent: the boot scripts install it (the node image bakes
# it). The nodes need it for the hub's kill path (Run Command), the hub for the
# dashboard's port forwarding (Session Manager). These are the permissions AWS
# documents as the agent's minimum for Run Command and Session Manager, and no
# more: no State Manager, Inventory or Patch Manager, whose calls the agent then
# makes and is refused. Session Manager preferences that encrypt sessions with
# KMS or log them to S3 or CloudWatch Logs would need grants of their own.

data "aws_iam_policy_document" "ssm_agent" {
  # The agent's registration and heartbeat. UpdateInstanceInformation takes the
  # instance resource type (and the ec2:SourceInstanceARN / ssm:SourceInstanceARN
  # keys, which here would only repeat the resource): the instances of this
  # account and region.
  statement {
    sid       = "SsmAgentRegistration"
    actions   = ["ssm:UpdateInstanceInformation"]
    resources = [local.instance_arns]
  }

  # Its message channels: ec2messages for Run Command, ssmmessages for Session
  # Manager (and Run Command on newer agents). These actions have no resource-level
  # permissions.
  statement {
    sid = "SsmAgentChannels"
    actions = [
      "ec2messages:AcknowledgeMessage",
      "ec2messages:DeleteMessage",
      "ec2messages:FailMessage",
      "ec2messages:GetEndpoint",
      "ec2messages:GetMessages",
      "ec2messages:SendReply",
      "ssmmessages:CreateControlChannel",
      "ssmmessages:CreateDataChannel",
      "ssmmessages:OpenControlChannel",
      "ssmmessages:OpenDataChannel",
    ]
    resources = ["*"]
  }
}

# --- hub ------------------------------------------------------------------------

data "aws_iam_policy_document" "hub" {
  # The SSM agent's statements (above), first in the document.
  source_policy_documents = [data.aws_iam_policy_document.ssm_agent.json]

  # fleet.aws.table: the run item, the site items (one by one, and in batches: get_sites), the node items, the
  # run's history (in batches: add_history).
  statement {
    sid = "StateTable"
    actions = [
      "dynamodb:BatchGetItem",
      "dynamodb:BatchWriteItem",
      "dynamodb:DescribeTable",
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.status.arn]
  }

  # fleet.aws.table.open_stamps: the sites that can still change, from the table's index `open`.
  statement {
    sid       = "OpenSitesIndex"
    actions   = ["dynamodb:Query"]
    resources = ["${aws_dynamodb_table.status.arn}/index/open"]
  }

  # fleet.aws.queue: enqueueing the sites; deleting the message of an attempt whose node died (its receipt is on
  # the record); at the finish, draining the run's leftovers (other runs' messages are put back), the queue
  # depths, and cli.report.check's look at the queue and the DLQ (received with visibility 0).
  statement {
    sid = "SiteQueue"
    actions = [
      "sqs:ChangeMessageVisibility",
      "sqs:DeleteMessage",
      "sqs:GetQueueAttributes",
      "sqs:GetQueueUrl",
      "sqs:ReceiveMessage",
      "sqs:SendMessage",
    ]
    resources = local.queue_arns
  }

  # cli.envs.aws preflight and fleet.aws.results: the bucket exists; a missing result reads as 404.
  statement {
    sid       = "BucketList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.results.arn]
  }

  # The hub's boot script (bundle/, hub/fleet.yaml) and fleet.aws.results reads (the export of results).
  statement {
    sid       = "BucketRead"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.results.arn}/*"]
  }

  # cli.envs.aws.upload_run_config (runs/<run id>/fleet.yaml for the run's nodes) and cli.report.page.publish
  # (runs/<run id>/summary.json and report.html at the run's end): under runs/ only, so a hub can never
  # replace the bundle or hub/, which every later hub and node installs as root.
  statement {
    sid       = "RunRecordsWrite"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.results.arn}/runs/*"]
  }

  # hub.promote and fleet.outputs.summary.export_evidence: the hub's copies of what its nodes staged, where readers take
  # them from: each site's result (<site>/<date>[/<run id>]/result.json, copied within S3 from the node's prefix
  # with the result's own type and tag), its attempts' evidence and a quarantined result beside it. Tagging: the
  # result tag the bucket's expiry rule selects (gridfleet=result), set by the copy and the evidence's PutObject.
  statement {
    sid     = "ResultCopies"
    actions = ["s3:PutObject", "s3:PutObjectTagging"]
    resources = [
      "${aws_s3_bucket.results.arn}/*/result.json",
      "${aws_s3_bucket.results.arn}/*/evidence/*",
      "${aws_s3_bucket.results.arn}/*/quarantine/*",
    ]
  }

  # hub.providers.ec2.Ec2Provider: finding the run's nodes. Describe* has no resource-level permissions.
  statement {
    sid       = "DescribeInstances"
    actions   = ["ec2:DescribeInstances"]
    resources = ["*"]
  }

  # hub.control.aws.ConsoleHostKeys: a node's SSH host keys from its console output.
  statement {
    sid       = "NodeConsoleOutput"
    actions   = ["ec2:GetConsoleOutput"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_role}"
      values   = ["node"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # hub.providers.ec2.Ec2Provider: launching nodes; the instance must carry gridfleet:role=node
  # and this stack's gridfleet:stack.
  statement {
    sid       = "RunNodeInstances"
    actions   = ["ec2:RunInstances"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.tag_role}"
      values   = ["node"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # hub.providers.ec2.Ec2Provider: what a node launch uses besides the instance
  # (spot-instances-request: the one-time request of a spot launch).
  statement {
    sid     = "RunNodeResources"
    actions = ["ec2:RunInstances"]
    resources = concat(
      [
        local.volume_arns,
        local.eni_arns,
        local.spot_req_arns,
        local.image_arns,
        aws_security_group.node.arn,
        aws_launch_template.node.arn,
      ],
      local.private_subnet,
      local.key_pair_arns,
    )
  }

  # hub.providers.ec2.Ec2Provider: the tags of a launch (TagSpecifications), nothing else.
  statement {
    sid       = "TagNodesAtLaunch"
    actions   = ["ec2:CreateTags"]
    resources = [local.instance_arns, local.volume_arns]

    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }
  }

  # hub.providers.ec2.Ec2Provider (nodes) and cli.envs.identity.self_stop (the hub itself, hub_self_stop=terminate),
  # of this stack only.
  statement {
    sid       = "TerminateFleetInstances"
    actions   = ["ec2:TerminateInstances"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_role}"
      values   = ["node", "hub"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # hub.control.aws.SsmControl: the kill path runs a shell command on a node through SSM.
  statement {
    sid       = "RunShellScriptDocument"
    actions   = ["ssm:SendCommand"]
    resources = ["arn:${local.partition}:ssm:${local.region}::document/AWS-RunShellScript"]
  }

  # hub.control.aws.SsmControl: ...on this stack's node instances only. Run Command
  # reads an instance's tags through ssm:resourceTag/<key>, as its documentation
  # conditions SendCommand (a global key such as aws:ResourceTag would also need
  # aws:ViaAWSService on this action).
  statement {
    sid       = "SendCommandToNodes"
    actions   = ["ssm:SendCommand"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "ssm:resourceTag/${local.tag_role}"
      values   = ["node"]
    }

    condition {
      test     = "StringEquals"
      variable = "ssm:resourceTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # hub.control.aws.SsmControl: polling and cancelling the command. These actions have no
  # resource-level permissions.
  statement {
    sid       = "CommandResults"
    actions   = ["ssm:CancelCommand", "ssm:GetCommandInvocation"]
    resources = ["*"]
  }

  # cli.envs.aws.AwsEnv.resolve_ami: the AMI id behind aws.node_ami, else aws.ami.
  statement {
    sid       = "AmiParameter"
    actions   = ["ssm:GetParameter"]
    resources = local.ami_parameter_arns
  }

  # hub.monitor (metrics.cloudwatch: true): the run's gauges and kills. PutMetricData has no
  # resource-level permissions; the condition holds it to the fleet's namespace.
  statement {
    sid       = "FleetMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = [var.metrics_namespace]
    }
  }

  # cli.envs.aws_plan.dry_run (`gridfleet run --dry-run` on the hub): the nodes' instance profile exists; and
  # cli.envs.aws.AwsEnv.node_role: its role's unique id, the first half of each node's own prefix of the bucket
  # (staging/<role id>:<instance id>/), where the hub finds what the node staged.
  statement {
    sid       = "NodeInstanceProfile"
    actions   = ["iam:GetInstanceProfile"]
    resources = [aws_iam_instance_profile.node.arn]
  }

  # hub.providers.ec2.Ec2Provider: the node launch template's instance profile.
  statement {
    sid       = "PassNodeRole"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.node.arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  # fleet.aws.notify.notify_finished, from the executor's Finish: the run's end
  # message to the stack's topic (notify.tf), and to no other topic.
  statement {
    sid       = "NotifyRunEnd"
    actions   = ["sns:Publish"]
    resources = [local.notify_topic_arn]
  }

  # cli.envs.aws.AwsEnv.ensure_site_access_points (fleet.aws.efs), before a run's nodes start: every site's own
  # access point on the stack's file system, found by its tags (DescribeAccessPoints of the file system)...
  statement {
    sid       = "SiteAccessPointsRead"
    actions   = ["elasticfilesystem:DescribeAccessPoints"]
    resources = [aws_efs_file_system.main.arn]
  }

  # ...and made where missing, on that file system only (CreateAccessPoint's resource), tagged with this stack
  # and a site and no other tag (aws:RequestTag, aws:TagKeys: CreateAccessPoint's condition keys).
  statement {
    sid       = "SiteAccessPointsCreate"
    actions   = ["elasticfilesystem:CreateAccessPoint"]
    resources = [aws_efs_file_system.main.arn]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }

    condition {
      test     = "Null"
      variable = "aws:RequestTag/${local.tag_site}"
      values   = ["false"]
    }

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "aws:TagKeys"
      values   = [local.tag_stack, local.tag_site]
    }
  }

  # Tags given to CreateAccessPoint are authorized as TagResource on the new access point too: granted for that
  # creation only (elasticfilesystem:CreateAction), with the same tags. An access point's ARN does not name its
  # file system; the creation above holds it to the stack's. No tagging of an existing access point.
  statement {
    sid       = "TagSiteAccessPointsAtCreation"
    actions   = ["elasticfilesystem:TagResource"]
    resources = [local.efs_access_point_arns]

    condition {
      test     = "StringEquals"
      variable = "elasticfilesystem:CreateAction"
      values   = ["CreateAccessPoint"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "aws:TagKeys"
      values   = [local.tag_stack, local.tag_site]
    }
  }

  # The hub's log shipper (`gridfleet ship-logs`: watchtower, which makes the
  # stream on its first refused put) and its boot script (`aws logs
  # create-log-stream`, `put-log-events`): streams of the hub's group only. Each
  # instance writes its own, <run id>/<instance id>; IAM cannot tell whose a
  # stream is, so the grant is the group's.
  statement {
    sid       = "ShipHubLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = [local.hub_log_streams]
  }

  # The hub's boot script: the run's Grid secret, a SecureString, and no other parameter. It reads the parameter
  # (`aws ssm get-parameter --with-decryption`): a hub that boots for a run whose secret is there keeps it, as the
  # run's nodes hold it; else it puts a new one (`aws ssm put-parameter --overwrite`).
  statement {
    sid       = "KeepGridSecret"
    actions   = ["ssm:GetParameter", "ssm:PutParameter"]
    resources = [local.grid_secret_arn]
  }

  # ...encrypted and decrypted with the stack's key, through SSM and for that parameter only.
  statement {
    sid       = "KeyForGridSecret"
    actions   = ["kms:Decrypt", "kms:Encrypt"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.via_ssm]
    }

    condition {
      test     = "StringEquals"
      variable = "kms:EncryptionContext:PARAMETER_ARN"
      values   = [local.grid_secret_arn]
    }
  }

  # The key behind the table, the queues and the bucket, used through them only.
  statement {
    sid       = "KeyThroughFleetServices"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.via_dynamodb, local.via_sqs, local.via_s3]
    }
  }
}

resource "aws_iam_role_policy" "hub" {
  name   = "${var.name_prefix}-hub"
  role   = aws_iam_role.hub.id
  policy = data.aws_iam_policy_document.hub.json
}

# --- node -----------------------------------------------------------------------

data "aws_iam_policy_document" "node" {
  # The SSM agent's statements (above), first in the document: the hub's kill path
  # runs its command on the node through it.
  source_policy_documents = [data.aws_iam_policy_document.ssm_agent.json]

  # node.agent: reading a site's record and the run item (whole items: the spec, the checkpoint).
  statement {
    sid       = "StateRead"
    actions   = ["dynamodb:GetItem"]
    resources = [aws_dynamodb_table.status.arn]
  }

  # What a node writes, and nothing else (fleet.record.ops through fleet.aws.table.write; put_node;
  # fleet.aws.ratelimit, fleet.aws.pacing): UpdateItem of the attributes of an attempt (claim,
  # report, beat, checkpoint, SAVED, end, requeue) and of its node item, a rate-limit group's
  # slot (next_at) and a domain's pace. Never a site's spec, mark or attemptBase, its result_key,
  # the hub's kill mark (kill_reason), any item's expiry (expireAt), nor the run item's attributes
  # (status, started_at, deadline_at, ...): dynamodb:Attributes must name only these (the keys
  # run_id and Site and the index key openSite included, as DynamoDB requires), and the Null test
  # keeps a request that names none from passing ForAllValues. Never an item of the hub's
  # partitions either: the run item and history (#run:<run id>), the index of runs (#runs) and the
  # high-water marks (#sites, PutItem only: HighWaterMarks), whatever attributes it names
  # (dynamodb:LeadingKeys, the item's partition key). ReturnValues may return only what was written.
  statement {
    sid       = "AttemptAndNodeWrites"
    actions   = ["dynamodb:UpdateItem"]
    resources = [aws_dynamodb_table.status.arn]

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "dynamodb:Attributes"
      values = [
        "run_id", "Site", "openSite",
        "run_status", "site_status", "attemptCount", "version", "instance_id", "enqueued", "receipt",
        "lastUpdateEpoch", "heartbeatEpoch", "url", "pages", "items", "checkpoint", "attempts", "spot_requeues",
        "failure_reason", "error", "kill_path", "staged",
        "failure_class", "http_status", "retry_at", "avoid_instance",
        "node_state", "booted_at", "sites_done", "site", "attempt", "stats",
        "next_at", "spacing", "requests", "backoffs", "base_s", "base_from", "spacing_s",
      ]
    }

    condition {
      test     = "Null"
      variable = "dynamodb:Attributes"
      values   = ["false"]
    }

    condition {
      test     = "ForAllValues:StringNotLike"
      variable = "dynamodb:LeadingKeys"
      values   = ["#run*", "#sites"]
    }

    condition {
      test     = "Null"
      variable = "dynamodb:LeadingKeys"
      values   = ["false"]
    }

    condition {
      test     = "StringEqualsIfExists"
      variable = "dynamodb:ReturnValues"
      values   = ["NONE", "UPDATED_OLD", "UPDATED_NEW"]
    }
  }

  # node.attempt (fleet.aws.table.put_mark): an incremental site's high-water mark, a whole item of
  # the #sites partition (dynamodb:LeadingKeys) with its own attributes only.
  statement {
    sid       = "HighWaterMarks"
    actions   = ["dynamodb:PutItem"]
    resources = [aws_dynamodb_table.status.arn]

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "dynamodb:LeadingKeys"
      values   = ["#sites"]
    }

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "dynamodb:Attributes"
      values   = ["run_id", "Site", "mark", "run", "at"]
    }

    condition {
      test     = "Null"
      variable = "dynamodb:LeadingKeys"
      values   = ["false"]
    }

    condition {
      test     = "StringEqualsIfExists"
      variable = "dynamodb:ReturnValues"
      values   = ["NONE"]
    }
  }

  # node.agent: an idle node reads its run's open sites before it leaves (it
  # stays while one is QUEUED: its message is on its way).
  statement {
    sid       = "OpenSites"
    actions   = ["dynamodb:Query"]
    resources = ["${aws_dynamodb_table.status.arn}/index/open"]
  }

  # node.agent: taking sites, extending their visibility while crawling,
  # deleting them when done, requeueing on a spot notice.
  statement {
    sid = "SiteQueue"
    actions = [
      "sqs:ChangeMessageVisibility",
      "sqs:DeleteMessage",
      "sqs:GetQueueUrl",
      "sqs:ReceiveMessage",
      "sqs:SendMessage",
    ]
    resources = local.queue_arns
  }

  # fleet.aws.results: a missing result reads as 404 (not 403) only with ListBucket.
  statement {
    sid       = "BucketList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.results.arn]
  }

  # What a node reads, and nothing else: the boot script's bundle/ (the code bundle and the
  # amazon-efs-utils .deb beside it) and the run's nodes' config (runs/<run id>/fleet.yaml, which
  # holds no secret); node.attempt's look for its result (HeadObject; a result found there is read
  # for its counts) and node.parts' read of the checkpoint parts a retry resumes from (any node's:
  # a retry goes on from the parts of the claims before it). Never the hub's config (hub/fleet.yaml,
  # with the webhook), the runs' summaries and reports, or evidence.
  statement {
    sid     = "BucketRead"
    actions = ["s3:GetObject"]
    resources = [
      "${aws_s3_bucket.results.arn}/bundle/*",
      "${aws_s3_bucket.results.arn}/runs/*/fleet.yaml",
      "${aws_s3_bucket.results.arn}/*/result.json",
      "${aws_s3_bucket.results.arn}/staging/*/parts/*",
    ]
  }

  # fleet.aws.results.put_staged: everything a node writes to the bucket (its staged result, its
  # checkpoint parts, its attempts' evidence, a result that broke the data contract) under its own
  # prefix alone, staging/<aws:userid>/ (for an instance's role: <role id>:<instance id>), and only
  # as new objects (If-None-Match: *, which S3 refuses for an existing key): no node can write
  # under another's prefix, replace what one wrote, or write where a reader takes a result or
  # evidence from. The hub makes a staged result the site's result (hub.promote, a copy of its
  # own) and stores evidence again when it exports. No tags: the bucket's rule for staging/
  # expires it.
  statement {
    sid       = "OwnPrefixWrites"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.results.arn}/staging/$${aws:userid}/*"]

    condition {
      test     = "StringEquals"
      variable = "s3:if-none-match"
      values   = ["*"]
    }
  }

  # node.site_mounts (root's helper, `mount -t efs -o tls,iam,accesspoint=...`): the stack's file system, through
  # an access point only, never its root. ClientMount and ClientWrite take the file system as their resource and
  # only elasticfilesystem:AccessPointArn and AccessedViaMountTarget as conditions (no tag key), so IAM cannot tell
  # one site's access point from another's: the helper mounts only a site this node holds a claim of.
  statement {
    sid       = "SharedFileSystem"
    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    resources = [aws_efs_file_system.main.arn]

    condition {
      test     = "ArnLike"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [local.efs_access_point_arns]
    }
  }

  # node.site_mounts (fleet.aws.efs.site_points): finding a claimed site's access point by its tags, among those
  # of the stack's file system (DescribeAccessPoints of it; the file system is the resource of that request).
  statement {
    sid       = "SiteAccessPointsRead"
    actions   = ["elasticfilesystem:DescribeAccessPoints"]
    resources = [aws_efs_file_system.main.arn]
  }

  # The node's log shipper and boot script, as the hub's (ShipHubLogs): streams of
  # the nodes' group only.
  statement {
    sid       = "ShipNodeLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = [local.node_log_streams]
  }

  # node.agent (metrics.cloudwatch: true): its jobs and heartbeat, by WorkerId. PutMetricData has
  # no resource-level permissions; the condition holds it to the fleet's namespace.
  statement {
    sid       = "FleetMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = [var.metrics_namespace]
    }
  }

  # The node's boot script (`aws ssm get-parameter --with-decryption`): the Grid secret the hub put, and no
  # other parameter.
  statement {
    sid       = "GetGridSecret"
    actions   = ["ssm:GetParameter"]
    resources = [local.grid_secret_arn]
  }

  # ...decrypted with the stack's key, through SSM and for that parameter only.
  statement {
    sid       = "KeyForGridSecret"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.via_ssm]
    }

    condition {
      test     = "StringEquals"
      variable = "kms:EncryptionContext:PARAMETER_ARN"
      values   = [local.grid_secret_arn]
    }
  }

  # The key behind the table, the queues, the bucket and EFS, used through them only.
  statement {
    sid       = "KeyThroughFleetServices"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.via_dynamodb, local.via_sqs, local.via_s3, local.via_efs]
    }
  }
}

resource "aws_iam_role_policy" "node" {
  name   = "${var.name_prefix}-node"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.node.json
}

# --- the Lambdas ------------------------------------------------------------------
# The watchdog restarts hubs the way the starter starts them: its document
# repeats the starter's statements (with its own log group and DLQ) and adds
# its own.

# What the starter and the watchdog both do to start a hub (lambdas.starter.start_hub, which the watchdog calls
# for a restart): one copy of those statements, merged into each function's own document.
data "aws_iam_policy_document" "start_hub" {
  # fleet.aws.ec2: live hubs of the run. Describe* has no resource-level permissions.
  statement {
    sid       = "DescribeInstances"
    actions   = ["ec2:DescribeInstances"]
    resources = ["*"]
  }

  # lambdas.starter.start_hub: a hub from the hub launch template, tagged gridfleet:role=hub and
  # this stack's gridfleet:stack.
  statement {
    sid       = "RunHubInstance"
    actions   = ["ec2:RunInstances"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.tag_role}"
      values   = ["hub"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # lambdas.starter.start_hub: what the hub launch uses besides the instance.
  statement {
    sid     = "RunHubResources"
    actions = ["ec2:RunInstances"]
    resources = concat(
      [
        local.volume_arns,
        local.eni_arns,
        local.image_arns,
        aws_security_group.hub.arn,
        aws_launch_template.hub.arn,
      ],
      local.private_subnet,
    )
  }

  # lambdas.starter.start_hub: the tags of the launch (TagSpecifications).
  statement {
    sid       = "TagHubAtLaunch"
    actions   = ["ec2:CreateTags"]
    resources = [local.instance_arns, local.volume_arns]

    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }
  }

  # lambdas.starter.start_hub: the run id on a stopped, reusable hub of this stack before starting it
  # (the operator tags that instance gridfleet:stack; the Lambda may not change the tag).
  statement {
    sid       = "TagReusableHub"
    actions   = ["ec2:CreateTags"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_role}"
      values   = ["hub"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }

    condition {
      test     = "ForAllValues:StringEquals"
      variable = "aws:TagKeys"
      values   = [local.tag_role, local.tag_run_id]
    }
  }

  # lambdas.starter.start_hub: starting the stopped, reusable hub of this stack.
  statement {
    sid       = "StartHub"
    actions   = ["ec2:StartInstances"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_role}"
      values   = ["hub"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # The hub launch template's instance profile.
  statement {
    sid       = "PassHubRole"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.hub.arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }
}

# What the Lambda runtime needs of both functions (each also writes its own log group and dead-letter queue).
data "aws_iam_policy_document" "lambda_runtime" {
  # Active tracing. X-Ray has no resource-level permissions.
  statement {
    sid       = "Tracing"
    actions   = ["xray:PutTelemetryRecords", "xray:PutTraceSegments"]
    resources = ["*"]
  }

  # The key, used through Lambda (the encrypted environment) and DynamoDB (the table) only.
  statement {
    sid       = "FleetKey"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.via_lambda, local.via_dynamodb]
    }
  }
}

data "aws_iam_policy_document" "starter" {
  source_policy_documents = [
    data.aws_iam_policy_document.start_hub.json,
    data.aws_iam_policy_document.lambda_runtime.json,
  ]

  # lambdas.starter.start_hub: the run item (is the run FINISHED? note the hub start).
  statement {
    sid       = "StateTable"
    actions   = ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    resources = [aws_dynamodb_table.status.arn]
  }

  # The Lambda runtime: the function's log group.
  statement {
    sid       = "OwnLogGroup"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.this["starter"].arn}:*"]
  }

  # Lambda: failed asynchronous invocations go to the function's DLQ.
  statement {
    sid       = "OwnDeadLetterQueue"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.lambda_dlq["starter"].arn]
  }
}

resource "aws_iam_role_policy" "starter" {
  name   = "${var.name_prefix}-starter"
  role   = aws_iam_role.starter.id
  policy = data.aws_iam_policy_document.starter.json
}

data "aws_iam_policy_document" "watchdog" {
  source_policy_documents = [
    data.aws_iam_policy_document.start_hub.json,
    data.aws_iam_policy_document.lambda_runtime.json,
  ]

  # lambdas.watchdog.watch: recent runs (Query), the heartbeat it watches and the
  # restart it claims (GetItem, UpdateItem), as the starter for a restart.
  # lambdas.watchdog.end_abandoned, ending a run whose hub is gone past deadline +
  # grace: its items read (Query, GetItem), its open sites marked FAILED
  # (conditional UpdateItem) and their history lines written (BatchWriteItem,
  # fleet.aws.table.add_history). The table only: no index.
  statement {
    sid = "StateTable"
    actions = [
      "dynamodb:BatchWriteItem",
      "dynamodb:GetItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.status.arn]
  }

  # lambdas.watchdog.end_abandoned (fleet.aws.archive.S3RunArchive.put_summary): the ended
  # run's record, runs/<run id>/summary.json, and nothing else in the bucket.
  statement {
    sid       = "RunSummaryWrite"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.results.arn}/runs/*/summary.json"]
  }

  # lambdas.watchdog.apply (lambdas.orphans.retire): instances of a finished, abandoned or unknown run, and stopped
  # instances of the stack that no configuration keeps. Only this stack's hubs and nodes: the
  # role tag leaves out untagged instances and the stack's NAT instance, which carries
  # gridfleet:stack (default_tags) but no role.
  statement {
    sid       = "TerminateFleetInstances"
    actions   = ["ec2:TerminateInstances"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_role}"
      values   = ["node", "hub"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # lambdas.watchdog.apply (lambdas.orphans.retire): the reusable hub is stopped, not terminated.
  statement {
    sid       = "StopHub"
    actions   = ["ec2:StopInstances"]
    resources = [local.instance_arns]

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_role}"
      values   = ["hub"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/${local.tag_stack}"
      values   = [var.name_prefix]
    }
  }

  # lambdas.watchdog.end_abandoned (fleet.aws.notify.notify_overdue): the message that
  # it ended an overdue run, to the stack's topic only.
  statement {
    sid       = "NotifyOverdueRun"
    actions   = ["sns:Publish"]
    resources = [local.notify_topic_arn]
  }

  # The bucket's SSE-KMS, for the summary of an abandoned run (RunSummaryWrite), through S3 only.
  statement {
    sid       = "KeyForRunSummary"
    actions   = ["kms:GenerateDataKey"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.via_s3]
    }
  }

  # The Lambda runtime: the function's log group.
  statement {
    sid       = "OwnLogGroup"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.this["watchdog"].arn}:*"]
  }

  # Lambda: failed asynchronous invocations go to the function's DLQ.
  statement {
    sid       = "OwnDeadLetterQueue"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.lambda_dlq["watchdog"].arn]
  }
}

resource "aws_iam_role_policy" "watchdog" {
  name   = "${var.name_prefix}-watchdog"
  role   = aws_iam_role.watchdog.id
  policy = data.aws_iam_policy_document.watchdog.json
}
