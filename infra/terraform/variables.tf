# --- where and what -------------------------------------------------------------

variable "region" {
  description = "AWS region of the fleet (fleet.yaml aws.region)."
  type        = string
  default     = "ap-northeast-2"
}

variable "name_prefix" {
  description = "Prefix of the names of the resources that are not named by a variable below."
  type        = string
  default     = "gridfleet"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}$", var.name_prefix))
    error_message = "name_prefix: 2 to 31 lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "tags" {
  description = "Extra tags on every resource (added to the provider's default_tags)."
  type        = map(string)
  default     = {}
}

# --- network --------------------------------------------------------------------

variable "vpc_cidr" {
  description = "CIDR block of the VPC. Public subnets get /24s at its start, private subnets /20s after them."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && try(tonumber(split("/", var.vpc_cidr)[1]) <= 16, false)
    error_message = "vpc_cidr must be a valid IPv4 CIDR block of /16 or larger."
  }
}

variable "azs" {
  description = "Availability zones: one public and one private subnet in each. At least two."
  type        = list(string)
  default     = ["ap-northeast-2a", "ap-northeast-2c"]

  validation {
    condition     = length(var.azs) >= 2 && length(var.azs) <= 6 && length(distinct(var.azs)) == length(var.azs)
    error_message = "azs: two to six distinct availability zones."
  }
}

variable "nat_instance_type" {
  description = "Instance type of the NAT instance (x86_64, to match ami_parameter). Every node's traffic goes through it: size it for the fleet."
  type        = string
  default     = "t3.micro"
}

# --- instances ------------------------------------------------------------------

variable "hub_instance_type" {
  description = "Instance type of the hub (Selenium Grid hub and the orchestrator)."
  type        = string
  default     = "t3.medium"
}

variable "node_instance_type" {
  description = "Instance type written into the node launch template. gridfleet overrides it at each launch with the types of fleet.yaml."
  type        = string
  default     = "c6i.large"
}

variable "hub_volume_size_gb" {
  description = "Size of the hub's root volume (GiB)."
  type        = number
  default     = 16
}

variable "node_volume_size_gb" {
  description = "Size of a node's root volume (GiB): Chromium, its caches and the crawl's scratch space."
  type        = number
  default     = 20
}

variable "ami_parameter" {
  description = "SSM parameter holding the AMI id of the hub, the nodes and the NAT instance (fleet.yaml aws.ami)."
  type        = string
  default     = "/aws/service/debian/release/12/latest/amd64"

  validation {
    condition     = startswith(var.ami_parameter, "/")
    error_message = "ami_parameter is an SSM parameter name starting with '/'."
  }
}

variable "node_ami_parameter" {
  description = "SSM parameter holding the AMI id of the nodes (fleet.yaml aws.node_ami): a node image baked by infra/packer. null: ami_parameter's."
  type        = string
  default     = null

  validation {
    condition     = var.node_ami_parameter == null || startswith(coalesce(var.node_ami_parameter, "/"), "/")
    error_message = "node_ami_parameter is an SSM parameter name starting with '/'."
  }
}

variable "hub_ami_parameter" {
  description = "SSM parameter holding the AMI id of the hubs: a node image baked by infra/packer holds all a hub installs, so it boots without apt or pip's downloads. null: ami_parameter's."
  type        = string
  default     = null

  validation {
    condition     = var.hub_ami_parameter == null || startswith(coalesce(var.hub_ami_parameter, "/"), "/")
    error_message = "hub_ami_parameter is an SSM parameter name starting with '/'."
  }
}

variable "key_name" {
  description = "EC2 key pair the nodes are launched with, for the hub's SSH kill path (fleet.yaml aws.key_name). null: no key pair, the hub kills through SSM only."
  type        = string
  default     = null
}

variable "max_nodes" {
  description = "Ceiling of the fleet: the alarm fires when the hub reports more active nodes than this."
  type        = number
  default     = 20
}

variable "crawl_uid" {
  description = "uid and gid of the crawl user, as which the nodes run their agent, Grid node and Chromium. The EFS access point makes every request as this user and creates its directory owned by it: it must equal fleet.yaml's fleet.crawl_uid."
  type        = number
  default     = 2000

  validation {
    condition     = var.crawl_uid >= 1000 && var.crawl_uid <= 60000 && floor(var.crawl_uid) == var.crawl_uid
    error_message = "crawl_uid: a whole number from 1000 to 60000 (fleet.yaml fleet.crawl_uid accepts the same)."
  }
}

variable "hub_instance_id" {
  description = <<-EOT
    A reusable hub instance the Lambdas start instead of launching one from the hub template
    (their GRIDFLEET_HUB_INSTANCE_ID). null (the default): none, every run launches a hub from the
    template, which terminates at its end. The instance is the operator's own, made outside this
    configuration: tagged gridfleet:role = hub and gridfleet:stack = name_prefix, with the hub's
    instance profile, and stop as its shutdown behaviour (it is started again for the next run).
  EOT
  type        = string
  default     = null

  validation {
    condition     = var.hub_instance_id == null || can(regex("^i-([0-9a-f]{8}|[0-9a-f]{17})$", var.hub_instance_id))
    error_message = "hub_instance_id: an EC2 instance id (i- and 8 or 17 hex digits), or null."
  }
}

variable "notify_topic_arn" {
  description = <<-EOT
    An existing SNS topic for the end-of-run messages (fleet.yaml's notify.sns_topic_arn, the
    watchdog's GRIDFLEET_NOTIFY_TOPIC_ARN). null (the default): the stack creates <name_prefix>-runs,
    encrypted with the AWS-managed key. A topic encrypted with a customer-managed key also needs
    kms:GenerateDataKey and kms:Decrypt on that key for the hub and watchdog roles.
  EOT
  type        = string
  default     = null

  validation {
    condition     = var.notify_topic_arn == null || can(regex("^arn:aws(-[a-z]+)*:sns:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:[A-Za-z0-9_-]{1,256}(\\.fifo)?$", var.notify_topic_arn))
    error_message = "notify_topic_arn: an SNS topic ARN (arn:aws:sns:<region>:<account>:<name>), or null."
  }
}

variable "hub_user_data_file" {
  description = <<-EOT
    The hub's cloud-init user-data. null (the default): hub-user-data.yaml next to
    this configuration, i.e. "$${path.module}/hub-user-data.yaml", produced with
      gridfleet render hub --config fleet.yaml > infra/terraform/hub-user-data.yaml
  EOT
  type        = string
  default     = null
}

# --- state, queue, results ------------------------------------------------------

variable "table_name" {
  description = "DynamoDB table of the runs and sites (fleet.yaml aws.table)."
  type        = string
  default     = "TrendlyzeStatus"
}

variable "queue_name" {
  description = "SQS queue of the sites to crawl (fleet.yaml aws.queue). Its dead-letter queue is <queue_name>-dlq."
  type        = string
  default     = "trendlyze-sites"
}

variable "queue_fifo" {
  description = "Make the site queue and its dead-letter queue FIFO queues (names <queue_name>.fifo and <queue_name>-dlq.fifo; fleet.yaml aws.queue_fifo): each (run, site, attempt) message is enqueued at most once within SQS's 5-minute deduplication window, even if a restarted hub sends it again."
  type        = bool
  default     = false
}

variable "max_receive_count" {
  description = "Receives of a site message before SQS moves it to the dead-letter queue (fleet.yaml aws.max_receive_count)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_receive_count >= 2
    error_message = "max_receive_count must be at least 2."
  }
}

variable "bucket_name" {
  description = "S3 bucket of the results, the code bundle (bundle/), the hub's config (hub/) and the runs' configs (runs/) (fleet.yaml aws.bucket)."
  type        = string
}

variable "result_retention_days" {
  description = "Days after which a result (an object tagged gridfleet=result) expires. Nothing else in the bucket expires: runs/ (each run's config, summary.json and report.html), bundle/ and hub/ are kept."
  type        = number
  default     = 90

  validation {
    condition     = var.result_retention_days >= 1
    error_message = "result_retention_days must be at least 1."
  }
}

variable "checkpoint_part_retention_days" {
  description = "Days after which what nodes write (under staging/: staged results, checkpoint parts, evidence) expires. The hub copies results and evidence where readers take them from, and a retry within the run reads the parts; nothing reads them after the run."
  type        = number
  default     = 3

  validation {
    condition     = var.checkpoint_part_retention_days >= 1
    error_message = "checkpoint_part_retention_days must be at least 1."
  }
}

# --- schedules ------------------------------------------------------------------

variable "start_schedule" {
  description = <<-EOT
    EventBridge schedule expression (UTC) of the starter Lambda, which starts the day's run.
    Daily at 01:00 UTC: "cron(0 1 * * ? *)". Every few days: "rate(3 days)" (counted from
    the apply) or "cron(0 1 */3 * ? *)" (days 1, 4, 7, ... of each month). Weekdays only:
    "cron(0 1 ? * MON-FRI *)".
  EOT
  type        = string
  default     = "cron(0 1 * * ? *)"

  validation {
    condition     = can(regex("^(cron|rate)\\(.+\\)$", var.start_schedule))
    error_message = "start_schedule must be a cron(...) or rate(...) expression."
  }
}

variable "lambda_reserved_concurrency" {
  description = <<-EOT
    Reserved concurrency of each Lambda (the starter and the watchdog): at most that many of its executions at
    once, set aside from the account's pool. null (the default): none reserved, each function draws on the
    account's unreserved pool. AWS refuses a reservation that would leave fewer than 100 unreserved executions
    in the account and region, so an account still at a small concurrency quota (new accounts often have 10)
    cannot reserve any: raise the quota (Service Quotas, "Concurrent executions") first. 1 keeps each function to
    one execution at a time.
  EOT
  type        = number
  default     = null

  validation {
    condition     = var.lambda_reserved_concurrency == null || try(var.lambda_reserved_concurrency >= 1 && floor(var.lambda_reserved_concurrency) == var.lambda_reserved_concurrency, false)
    error_message = "lambda_reserved_concurrency: a whole number of executions, 1 or more (0 would stop the function), or null for none reserved."
  }
}

variable "watchdog_schedule" {
  description = "EventBridge schedule expression of the watchdog Lambda."
  type        = string
  default     = "rate(2 minutes)"
}

variable "hub_stale_s" {
  description = "Seconds a hub heartbeat may stay unchanged before the watchdog starts a new hub for the run."
  type        = number
  default     = 600
}

variable "run_grace_s" {
  description = "Seconds after a run's deadline before the watchdog treats a still RUNNING run as abandoned."
  type        = number
  default     = 3600
}

variable "lookback_runs" {
  description = "Number of recent runs the watchdog examines on each pass."
  type        = number
  default     = 7
}

# --- monitoring -----------------------------------------------------------------

variable "log_retention_days" {
  description = "Retention of the CloudWatch log groups (days; one of the values CloudWatch Logs accepts)."
  type        = number
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, ...)."
  }
}

variable "metrics_namespace" {
  description = <<-EOT
    CloudWatch namespace of gridfleet's metrics (fleet.yaml metrics.namespace; published when
    metrics.cloudwatch is true). The hub's, without dimensions: the gauges ActiveNodes, SitesQueued,
    SitesRunning, SitesCompleted, SitesFailed, RunProgress, QueueVisible, QueueInFlight, QueueDlq (current
    values), and Kills (kills since its last publish; also by KillPath). Each node's, by WorkerId (its instance id):
    JobDuration, JobsCompleted, JobErrors (also by ErrorType), Heartbeat. The hub and node roles may put
    metrics into this namespace only.
  EOT
  type        = string
  default     = "gridfleet"

  validation {
    condition     = can(regex("^[A-Za-z0-9 ._/#-][A-Za-z0-9 ._/#:-]{0,254}$", var.metrics_namespace)) && !startswith(var.metrics_namespace, "AWS/")
    error_message = "metrics_namespace: 1 to 255 letters, digits, spaces and . _ / # : -, not starting with ':' or AWS/ (CloudWatch's rule for custom namespaces)."
  }
}

variable "queue_depth_alarm_threshold" {
  description = "Alarm when more site messages than this are visible in the queue for 30 minutes."
  type        = number
  default     = 5000
}

variable "run_overdue_s" {
  description = "Alarm when the oldest site message is older than this many seconds: the run is overdue."
  type        = number
  default     = 21600
}

variable "alarm_email" {
  description = "E-mail address subscribed to the alarms topic (confirm the subscription e-mail). null: no subscription."
  type        = string
  default     = null
}

variable "create_spot_service_linked_role" {
  description = "Create the account's EC2 Spot service-linked role (AWSServiceRoleForEC2Spot). Set false when the account has it already (it has if it ever launched a spot instance)."
  type        = bool
  default     = true
}
