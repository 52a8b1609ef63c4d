"""How each Terraform resource type the twin makes becomes calls to moto.

A creator receives the resource's evaluated arguments (nested blocks as lists of dicts, as Terraform holds
them) and returns the attributes it computed (`id`, `arn`, ...); the caller merges them with the arguments, so
`aws_iam_role.hub.name` is the argument and `.arn` what IAM answered. Each creator says which arguments it
applies (`uses`) and which it leaves out on purpose (`ignores`); an argument in neither stops the apply, so a
setting added to the .tf files is never dropped unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class ClientSource(Protocol):
    """Where boto3 clients come from (`fleet.aws.clients.AwsClients` is one)."""

    def client(self, service: str) -> Any: ...


@dataclass(frozen=True)
class Ctx:
    clients: ClientSource
    region: str
    account_id: str
    partition: str
    default_tags: Mapping[str, str]

    def tags(self, args: Mapping[str, Any]) -> dict[str, str]:
        """The provider's default tags merged with the resource's own (Terraform's `tags_all`)."""
        return {**self.default_tags, **(args.get("tags") or {})}

    def tag_list(self, args: Mapping[str, Any], key: str = "Key", value: str = "Value") -> list[dict[str, str]]:
        return [{key: k, value: v} for k, v in self.tags(args).items()]


#: Resource types the twin does not make, and why (see `twin.terraform.apply`).
SKIPPED: dict[str, str] = {
    "aws_internet_gateway": "no traffic leaves the twin",
    "aws_route_table": "no routing on the twin",
    "aws_route": "no routing on the twin",
    "aws_route_table_association": "no routing on the twin",
    "aws_vpc_endpoint": "no routing on the twin",
    "aws_instance": "the NAT instance: no traffic leaves the twin",
    "aws_eip": "the NAT's address: no traffic leaves the twin",
    "aws_flow_log": "no flow logs on the twin",
    "aws_efs_backup_policy": "no backups on the twin",
    "aws_iam_service_linked_role": "moto launches spot instances without it",
    "aws_s3_bucket_ownership_controls": "bucket settings moto does not enforce",
    "aws_s3_bucket_public_access_block": "bucket settings moto does not enforce",
    "aws_s3_bucket_server_side_encryption_configuration": "bucket settings moto does not enforce",
    "aws_s3_bucket_lifecycle_configuration": "no expiry on the twin",
    "aws_s3_bucket_notification": "no downstream consumers on the twin",
    "aws_s3_bucket_logging": "no access logs on the twin",
    "aws_s3_bucket_policy": "bucket settings moto does not enforce",
    "aws_sqs_queue_redrive_allow_policy": "moto accepts RedriveAllowPolicy and keeps nothing of it",
    "aws_sns_topic_subscription": "no e-mail on the twin",
    "aws_cloudwatch_metric_alarm": "no alarms on the twin",
    "aws_cloudwatch_dashboard": "no dashboard on the twin",
}


Creator = Callable[[Ctx, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Kind:
    create: Creator
    uses: frozenset[str]
    ignores: frozenset[str]


KINDS: dict[str, Kind] = {}


def creates(rtype: str, uses: str, ignores: str = "") -> Callable[[Creator], Creator]:
    def register(fn: Creator) -> Creator:
        KINDS[rtype] = Kind(fn, frozenset(uses.split()), frozenset(ignores.split()))
        return fn

    return register


def single(args: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """A nested block that may appear at most once."""
    found = args.get(name) or []
    if len(found) > 1:
        raise ValueError(f"{name}: expected one block, got {len(found)}")
    return found[0] if found else None


def pascal(value: Any, lists: frozenset[str] = frozenset(), renames: Mapping[str, str] | None = None) -> Any:
    """Terraform's snake_case arguments as the API's PascalCase members; a nested block is a member unless its
    name is in `lists`; null arguments are left out."""
    if isinstance(value, list):
        return [pascal(v, lists, renames) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, v in value.items():
        if v is None:
            continue
        if isinstance(v, list) and v and isinstance(v[0], dict) and key not in lists:
            if len(v) > 1:
                raise ValueError(f"{key}: expected one block, got {len(v)}")
            v = v[0]
        name = (renames or {}).get(key) or "".join(p.capitalize() for p in key.split("_"))
        out[name] = pascal(v, lists, renames)
    return out


# --- network -------------------------------------------------------------------------------------------


@creates("aws_vpc", "cidr_block enable_dns_support enable_dns_hostnames tags")
def _vpc(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ec2 = ctx.clients.client("ec2")
    spec = [{"ResourceType": "vpc", "Tags": ctx.tag_list(a)}]
    vpc = ec2.create_vpc(CidrBlock=a["cidr_block"], TagSpecifications=spec)["Vpc"]
    for flag, member in (("enable_dns_support", "EnableDnsSupport"), ("enable_dns_hostnames", "EnableDnsHostnames")):
        if a.get(flag) is not None:
            ec2.modify_vpc_attribute(VpcId=vpc["VpcId"], **{member: {"Value": a[flag]}})
    return {"id": vpc["VpcId"], "arn": f"arn:{ctx.partition}:ec2:{ctx.region}:{ctx.account_id}:vpc/{vpc['VpcId']}"}


@creates("aws_subnet", "vpc_id availability_zone cidr_block tags", "map_public_ip_on_launch")
def _subnet(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    subnet = ctx.clients.client("ec2").create_subnet(
        VpcId=a["vpc_id"],
        CidrBlock=a["cidr_block"],
        AvailabilityZone=a["availability_zone"],
        TagSpecifications=[{"ResourceType": "subnet", "Tags": ctx.tag_list(a)}],
    )["Subnet"]
    return {"id": subnet["SubnetId"], "arn": subnet["SubnetArn"]}


def _revoke_all(ec2: Any, group: dict[str, Any]) -> None:
    if group.get("IpPermissions"):
        ec2.revoke_security_group_ingress(GroupId=group["GroupId"], IpPermissions=group["IpPermissions"])
    if group.get("IpPermissionsEgress"):
        ec2.revoke_security_group_egress(GroupId=group["GroupId"], IpPermissions=group["IpPermissionsEgress"])


@creates("aws_security_group", "name description vpc_id tags")
def _security_group(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    """As Terraform does, the allow-all egress rule EC2 adds to a new group is removed: the group has only the
    rules its rule resources add."""
    ec2 = ctx.clients.client("ec2")
    gid = ec2.create_security_group(
        GroupName=a["name"],
        Description=a.get("description") or "Managed by Terraform",  # the provider's default
        VpcId=a["vpc_id"],
        TagSpecifications=[{"ResourceType": "security-group", "Tags": ctx.tag_list(a)}],
    )["GroupId"]
    _revoke_all(ec2, ec2.describe_security_groups(GroupIds=[gid])["SecurityGroups"][0])
    return {"id": gid, "arn": f"arn:{ctx.partition}:ec2:{ctx.region}:{ctx.account_id}:security-group/{gid}"}


@creates("aws_default_security_group", "vpc_id tags")
def _default_security_group(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    """The VPC's default group, emptied of rules (the .tf declares none)."""
    ec2 = ctx.clients.client("ec2")
    filters = [{"Name": "vpc-id", "Values": [a["vpc_id"]]}, {"Name": "group-name", "Values": ["default"]}]
    group = ec2.describe_security_groups(Filters=filters)["SecurityGroups"][0]
    _revoke_all(ec2, group)
    ec2.create_tags(Resources=[group["GroupId"]], Tags=ctx.tag_list(a))
    return {"id": group["GroupId"]}


def _rule(ctx: Ctx, a: dict[str, Any], direction: str) -> dict[str, Any]:
    perm: dict[str, Any] = {"IpProtocol": a["ip_protocol"]}
    if a.get("from_port") is not None:
        perm.update(FromPort=a["from_port"], ToPort=a["to_port"])
    peer = {"Description": a["description"]} if a.get("description") else {}
    if a.get("referenced_security_group_id"):
        perm["UserIdGroupPairs"] = [{"GroupId": a["referenced_security_group_id"], **peer}]
    if a.get("cidr_ipv4"):
        perm["IpRanges"] = [{"CidrIp": a["cidr_ipv4"], **peer}]
    ec2 = ctx.clients.client("ec2")
    call = ec2.authorize_security_group_ingress if direction == "ingress" else ec2.authorize_security_group_egress
    answer = call(GroupId=a["security_group_id"], IpPermissions=[perm])
    rules = answer.get("SecurityGroupRules") or [{}]
    return {"id": rules[0].get("SecurityGroupRuleId", "")}


_RULE_ARGS = "security_group_id referenced_security_group_id cidr_ipv4 ip_protocol from_port to_port description"


@creates("aws_vpc_security_group_ingress_rule", _RULE_ARGS)
def _ingress(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    return _rule(ctx, a, "ingress")


@creates("aws_vpc_security_group_egress_rule", _RULE_ARGS)
def _egress(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    return _rule(ctx, a, "egress")


# --- key, file system ------------------------------------------------------------------------------------


@creates("aws_kms_key", "description policy enable_key_rotation tags", "deletion_window_in_days")
def _kms_key(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    kms = ctx.clients.client("kms")
    tags = ctx.tag_list(a, "TagKey", "TagValue")
    key = kms.create_key(Description=a["description"], Policy=a["policy"], Tags=tags)["KeyMetadata"]
    if a.get("enable_key_rotation"):
        kms.enable_key_rotation(KeyId=key["KeyId"])
    return {"id": key["KeyId"], "key_id": key["KeyId"], "arn": key["Arn"]}


@creates("aws_kms_alias", "name target_key_id")
def _kms_alias(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ctx.clients.client("kms").create_alias(AliasName=a["name"], TargetKeyId=a["target_key_id"])
    return {"id": a["name"], "arn": f"arn:{ctx.partition}:kms:{ctx.region}:{ctx.account_id}:{a['name']}"}


@creates(
    "aws_efs_file_system", "creation_token encrypted kms_key_id performance_mode throughput_mode lifecycle_policy tags"
)
def _efs(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    efs = ctx.clients.client("efs")
    fs = efs.create_file_system(
        **pascal({k: a.get(k) for k in ("creation_token", "encrypted", "kms_key_id", "performance_mode")}),
        ThroughputMode=a["throughput_mode"],
        Tags=ctx.tag_list(a),
    )
    if a.get("lifecycle_policy"):
        policies = pascal(a["lifecycle_policy"], renames={"transition_to_ia": "TransitionToIA"})
        efs.put_lifecycle_configuration(FileSystemId=fs["FileSystemId"], LifecyclePolicies=policies)
    return {"id": fs["FileSystemId"], "arn": fs["FileSystemArn"]}


@creates("aws_efs_mount_target", "file_system_id subnet_id security_groups")
def _mount_target(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    mt = ctx.clients.client("efs").create_mount_target(
        FileSystemId=a["file_system_id"], SubnetId=a["subnet_id"], SecurityGroups=a["security_groups"]
    )
    return {"id": mt["MountTargetId"], "ip_address": mt.get("IpAddress")}


@creates("aws_efs_access_point", "file_system_id posix_user root_directory tags")
def _access_point(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ap = ctx.clients.client("efs").create_access_point(
        FileSystemId=a["file_system_id"],
        PosixUser=pascal(single(a, "posix_user")),
        RootDirectory=pascal(single(a, "root_directory")),
        Tags=ctx.tag_list(a),
    )
    return {"id": ap["AccessPointId"], "arn": ap["AccessPointArn"]}


@creates("aws_efs_file_system_policy", "file_system_id policy")
def _efs_policy(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ctx.clients.client("efs").put_file_system_policy(FileSystemId=a["file_system_id"], Policy=a["policy"])
    return {"id": a["file_system_id"]}


# --- IAM -------------------------------------------------------------------------------------------------


@creates("aws_iam_role", "name description assume_role_policy tags")
def _role(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    role = ctx.clients.client("iam").create_role(
        RoleName=a["name"],
        Description=a.get("description") or "",
        AssumeRolePolicyDocument=a["assume_role_policy"],
        Tags=ctx.tag_list(a),
    )["Role"]
    return {"id": a["name"], "arn": role["Arn"], "unique_id": role["RoleId"]}


@creates("aws_iam_role_policy", "name role policy")
def _role_policy(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ctx.clients.client("iam").put_role_policy(RoleName=a["role"], PolicyName=a["name"], PolicyDocument=a["policy"])
    return {"id": f"{a['role']}:{a['name']}"}


@creates("aws_iam_instance_profile", "name role tags")
def _instance_profile(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    iam = ctx.clients.client("iam")
    profile = iam.create_instance_profile(InstanceProfileName=a["name"], Tags=ctx.tag_list(a))["InstanceProfile"]
    iam.add_role_to_instance_profile(InstanceProfileName=a["name"], RoleName=a["role"])
    return {"id": a["name"], "arn": profile["Arn"]}


# --- state, queues, bucket, topic, logs --------------------------------------------------------------------


@creates(
    "aws_dynamodb_table",
    "name billing_mode hash_key range_key attribute local_secondary_index ttl server_side_encryption "
    "deletion_protection_enabled tags",
    "point_in_time_recovery",
)
def _table(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    ddb = ctx.clients.client("dynamodb")
    keys = [{"AttributeName": a["hash_key"], "KeyType": "HASH"}]
    if a.get("range_key"):
        keys.append({"AttributeName": a["range_key"], "KeyType": "RANGE"})
    indexes = [
        {
            "IndexName": lsi["name"],
            "KeySchema": [keys[0], {"AttributeName": lsi["range_key"], "KeyType": "RANGE"}],
            "Projection": pascal({k: lsi.get(k) for k in ("projection_type", "non_key_attributes")}),
        }
        for lsi in a.get("local_secondary_index") or []
    ]
    sse = single(a, "server_side_encryption") or {}
    table = ddb.create_table(
        TableName=a["name"],
        BillingMode=a["billing_mode"],
        KeySchema=keys,
        AttributeDefinitions=[{"AttributeName": x["name"], "AttributeType": x["type"]} for x in a["attribute"]],
        **({"LocalSecondaryIndexes": indexes} if indexes else {}),
        SSESpecification={"Enabled": bool(sse.get("enabled")), "SSEType": "KMS", "KMSMasterKeyId": sse["kms_key_arn"]}
        if sse.get("enabled")
        else {"Enabled": False},
        DeletionProtectionEnabled=bool(a.get("deletion_protection_enabled")),
        Tags=ctx.tag_list(a),
    )["TableDescription"]
    ttl = single(a, "ttl")
    if ttl and ttl.get("enabled"):
        spec = {"Enabled": True, "AttributeName": ttl["attribute_name"]}
        ddb.update_time_to_live(TableName=a["name"], TimeToLiveSpecification=spec)
    return {"id": a["name"], "arn": table["TableArn"]}


_QUEUE_ATTRIBUTES = {
    "visibility_timeout_seconds": "VisibilityTimeout",
    "message_retention_seconds": "MessageRetentionPeriod",
    "kms_master_key_id": "KmsMasterKeyId",
    "kms_data_key_reuse_period_seconds": "KmsDataKeyReusePeriodSeconds",
    "sqs_managed_sse_enabled": "SqsManagedSseEnabled",
    "redrive_policy": "RedrivePolicy",
}


@creates("aws_sqs_queue", "name fifo_queue content_based_deduplication tags " + " ".join(_QUEUE_ATTRIBUTES))
def _queue(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    sqs = ctx.clients.client("sqs")
    attributes = {api: _text(a[k]) for k, api in _QUEUE_ATTRIBUTES.items() if a.get(k) is not None}
    if a.get("fifo_queue"):  # a standard queue is made without the FIFO attributes, as Terraform does
        attributes.update(FifoQueue="true", ContentBasedDeduplication=_text(bool(a.get("content_based_deduplication"))))
    url = sqs.create_queue(QueueName=a["name"], Attributes=attributes, tags=ctx.tags(a))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return {"id": url, "url": url, "arn": arn, "fifo_queue": bool(a.get("fifo_queue"))}


@creates("aws_s3_bucket", "bucket tags")
def _bucket(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    s3 = ctx.clients.client("s3")
    where = {} if ctx.region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": ctx.region}}
    s3.create_bucket(Bucket=a["bucket"], **where)
    s3.put_bucket_tagging(Bucket=a["bucket"], Tagging={"TagSet": ctx.tag_list(a)})
    return {"id": a["bucket"], "arn": f"arn:{ctx.partition}:s3:::{a['bucket']}"}


@creates("aws_s3_bucket_versioning", "bucket versioning_configuration")
def _versioning(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    status = single(a, "versioning_configuration") or {}
    config = {"Status": status["status"]}
    ctx.clients.client("s3").put_bucket_versioning(Bucket=a["bucket"], VersioningConfiguration=config)
    return {"id": a["bucket"]}


@creates("aws_sns_topic", "name kms_master_key_id tags")
def _topic(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    attributes = {"KmsMasterKeyId": a["kms_master_key_id"]} if a.get("kms_master_key_id") else {}
    arn = ctx.clients.client("sns").create_topic(Name=a["name"], Attributes=attributes, Tags=ctx.tag_list(a))
    return {"id": arn["TopicArn"], "arn": arn["TopicArn"]}


@creates("aws_cloudwatch_log_group", "name retention_in_days kms_key_id tags")
def _log_group(ctx: Ctx, a: dict[str, Any]) -> dict[str, Any]:
    logs = ctx.clients.client("logs")
    logs.create_log_group(logGroupName=a["name"], kmsKeyId=a["kms_key_id"], tags=ctx.tags(a))
    if a.get("retention_in_days"):
        logs.put_retention_policy(logGroupName=a["name"], retentionInDays=a["retention_in_days"])
    return {"id": a["name"], "arn": f"arn:{ctx.partition}:logs:{ctx.region}:{ctx.account_id}:log-group:{a['name']}"}


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
