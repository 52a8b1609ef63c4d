"""`gridfleet aws preflight`: is this account ready for the fleet's first night? One line per check, read-only.

A team runs it once before its first run and again after any change to the account. Each check is a small
function (here the account-wide ones, in cli.envs.aws_account those of what the instances boot) answering with a
status and one line; `run_checks` asks them in turn and makes any AWS error a check could not get past into that
check's FAIL, worded by `fleet.aws.errors` (the call and the permission it needs). When the credentials (or the
endpoint, or the region) fail, every call after would fail alike: the checks left are `skipped`, not asked.
Exit 0 when nothing FAILs, 1 when something does, 2 for bad input (the config, the --tf-output file).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console

from cli.commands.tf_config import OUTPUT, aws_section, read_source
from cli.envs import aws as aws_env
from cli.envs.aws_account import (
    INSTANCE_TYPE,
    Account,
    Answer,
    NotReady,
    Status,
    bundle,
    efs_utils,
    fail,
    image,
    nat,
    ok,
    quota_value,
    skipped,
    ssm_agent,
    whole,
)
from fleet.aws.clients import AwsClients, error_code
from fleet.aws.errors import Kind, aws_failure
from fleet.config.aws import AwsConfig
from fleet.config.load import load_config
from fleet.errors import ConfigError, MissingResource

ACCOUNT_ID = re.compile(r"\d{12}")
ARN = re.compile(r"arn:aws[a-z-]*:(iam|sts)::\d{12}:[\w+=,.@/-]{1,512}")
#: Failures after which every other call would fail alike: the checks left are not asked.
_STOPS = frozenset({Kind.NO_CREDENTIALS, Kind.BAD_CREDENTIALS, Kind.NO_REGION, Kind.NO_ANSWER})
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
#: EC2's vCPU quotas (Service Quotas codes) of the standard families (A, C, D, H, I, M, R, T, Z).
SPOT_QUOTA = ("L-34B43A08", "All Standard Spot Instance Requests")
ON_DEMAND_QUOTA = ("L-1216C47A", "Running On-Demand Standard instances")
#: Executions AWS keeps unreserved in an account and region: reservations must leave them.
LAMBDA_UNRESERVED_MIN = 100


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str  # one line: what was found, or what is wrong and what to do


@dataclass(frozen=True)
class Spec:
    name: str
    question: Callable[[Account], Answer]
    asks_aws: bool = True


def cmd_preflight(args: argparse.Namespace, console: Console) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as e:  # one line, the first problem (a `run` or `check` lists them all)
        more = f" (and {len(e.problems) - 1} more problem(s) in it)" if len(e.problems) > 1 else ""
        raise ConfigError([f"{e.problems[0]}{more}"]) from None
    stack = terraform(*tf_outputs(args.tf_output)) if args.tf_output else Spec("stack", resources)
    checks = run_checks(plan(stack), Account(config, AwsClients(config.aws), source=args.config))
    for c in checks:  # never markup: a detail holds names from the config and from AWS
        console.print(f"{c.status.value:<5} {c.name}: {c.detail}", markup=False, highlight=False)
    failed = [c.name for c in checks if c.status is Status.FAIL]
    if failed:
        console.print(f"not ready: {len(failed)} check(s) FAIL: {', '.join(failed)}", markup=False, highlight=False)
        return 1
    passed, skips = (sum(c.status is status for c in checks) for status in (Status.OK, Status.SKIPPED))
    console.print(f"ready: {passed} checks ok{f', {skips} skipped' if skips else ''}", markup=False, highlight=False)
    return 0


def plan(stack: Spec) -> list[Spec]:
    """The checks in the order a reader fixes them: who and where, what exists, what boots, what may run."""
    return [
        Spec("credentials", credentials),
        stack,
        Spec("image", image),
        Spec("bundle", bundle),
        Spec("efs-utils", efs_utils),
        Spec("ssm-agent", ssm_agent),
        Spec("spot-vcpus", spot_quota),
        Spec("on-demand-vcpus", on_demand_quota),
        Spec("lambda", lambda_concurrency),
        Spec("spot-role", spot_role),
        Spec("log-groups", log_groups),
        Spec("nat", nat),
    ]


def run_checks(specs: list[Spec], acct: Account) -> list[Check]:
    """Each check's answer, in order; an AWS error it could not get past is its FAIL, in `aws_failure`'s words."""
    out: list[Check] = []
    stop: str | None = None
    for spec in specs:
        if stop is not None and spec.asks_aws:
            out.append(Check(spec.name, Status.SKIPPED, f"not asked: {stop}"))
            continue
        try:
            status, detail = spec.question(acct)
        except MissingResource as e:  # NotReady among them: what an answer shows is not ready
            status, detail = Status.FAIL, str(e)
        except (ClientError, BotoCoreError) as e:
            failure = aws_failure(e)
            status, detail = Status.FAIL, failure.line() if failure else f"the AWS call failed: {e}"
            if failure is not None and failure.kind in _STOPS:
                stop = failure.problem
        out.append(Check(spec.name, status, one_line(detail)))
    return out


def one_line(text: str, limit: int = 600) -> str:
    """A detail as one line of bounded length: an error message AWS (or a proxy) answered may be a page of HTML."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- who and where ------------------------------------------------------------------------------------------------
def credentials(acct: Account) -> Answer:
    who = acct.client("sts").get_caller_identity()
    account, arn = who.get("Account"), who.get("Arn")
    if not (isinstance(account, str) and ACCOUNT_ID.fullmatch(account) and isinstance(arn, str) and ARN.fullmatch(arn)):
        return fail("STS GetCallerIdentity answered with no account id and ARN: check aws.endpoint_url")
    region = acct.config.aws.region
    regions = acct.client("ec2").describe_regions(AllRegions=True).get("Regions", [])
    status = {r.get("RegionName"): r.get("OptInStatus") for r in regions}
    if region not in status:
        return fail(f"account {account} ({arn}): the region {region!r} is not one EC2 knows: check aws.region")
    if status[region] == "not-opted-in":
        return fail(f"account {account} ({arn}): the region {region} is not enabled for the account: enable it")
    return ok(f"account {account} ({arn}), region {region}")


# --- what exists --------------------------------------------------------------------------------------------------
def tf_outputs(path: str) -> tuple[dict[str, Any], str]:
    """The `gridfleet_aws` output of `terraform output -json` in `path`, validated; UsageError naming the file."""
    text, source = read_source(path)
    return aws_section(text, source)["aws"], source


def terraform(values: dict[str, Any], source: str) -> Spec:
    """The stack's outputs against the config: every key Terraform decides must be the config's."""

    def question(acct: Account) -> Answer:
        theirs = AwsConfig.model_validate(values)
        mine = acct.config.aws
        differ = [
            f"aws.{k} is {_value(mine, k)!r}, Terraform's {_value(theirs, k)!r}"
            for k in values
            if _value(mine, k) != _value(theirs, k)
        ]
        if differ:
            return fail(
                f"{'; '.join(differ)} ({source}): the config is not this stack's: "
                "`terraform output -json | gridfleet config from-terraform` prints its aws: section"
            )
        return ok(f"the {len(values)} keys of {OUTPUT} in {source} are the config's aws: section")

    return Spec("stack", question, asks_aws=False)


def _value(aws: AwsConfig, key: str) -> Any:
    """A key's value as the fleet uses it (a DLQ named by default is still named)."""
    derived = {"queue": aws.queue_name, "dlq": aws.dlq_name, "node_ami": aws.node_ami or aws.ami}
    return derived[key] if key in derived else getattr(aws, key, None)


def resources(acct: Account) -> Answer:
    """Each resource the config names exists."""
    aws, env = acct.config.aws, aws_env.connect(acct.config, acct.clients, source=acct.source)
    probes: list[tuple[str, Callable[[], object]]] = [
        (f"table {aws.table}", env.table.check_exists),
        (f"queue {aws.queue_name}", lambda: env.queue.url),
        (f"DLQ {aws.dlq_name}", lambda: env.queue.dlq_url),
        (f"bucket {aws.bucket}", env.results.check_exists),
        (f"EFS {aws.efs_id}", lambda: _efs(acct)),
        (f"{len(aws.subnet_ids)} subnet(s), {len(aws.security_group_ids)} security group(s)", lambda: _network(acct)),
    ]
    if aws.instance_profile:
        probes.append((f"instance profile {aws.instance_profile}", env.check_instance_profile))
    for name in dict.fromkeys(n for n in (aws.node_launch_template, aws.hub_launch_template) if n):
        probes.append((f"launch template {name}", partial(acct.template_data, name)))
    missing = []
    for _, probe in probes:
        try:
            probe()
        except NotReady as e:  # its line says what to do
            missing.append(str(e))
        except MissingResource as e:
            missing.append(f"{e}: run `gridfleet aws bootstrap` or apply infra/terraform")
    if missing:
        return fail("; ".join(missing))
    return ok(f"{', '.join(label for label, _ in probes)}: all exist")


def _efs(acct: Account) -> None:
    aws, efs = acct.config.aws, acct.client("efs")
    if not aws.efs_id:
        raise NotReady("aws.efs_id is not set: the nodes keep their Chrome profiles on EFS")
    try:  # each site's access point is the hub's to make, at the start of a run
        efs.describe_file_systems(FileSystemId=aws.efs_id)
    except ClientError as e:
        if error_code(e) != "FileSystemNotFound":
            raise
        raise NotReady(f"EFS file system (aws.efs_id {aws.efs_id}) does not exist: apply infra/terraform") from None


def _network(acct: Account) -> None:
    """The subnets and security groups exist (asked by filter: the answer lists those that do)."""
    aws, ec2 = acct.config.aws, acct.client("ec2")
    found: set[Any] = set()
    if aws.subnet_ids:
        subnets = ec2.describe_subnets(Filters=[{"Name": "subnet-id", "Values": list(aws.subnet_ids)}])
        found |= {s.get("SubnetId") for s in subnets.get("Subnets", [])}
    if aws.security_group_ids:
        groups = ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": list(aws.security_group_ids)}])
        found |= {g.get("GroupId") for g in groups.get("SecurityGroups", [])}
    missing = [x for x in (*aws.subnet_ids, *aws.security_group_ids) if x not in found]
    if missing:
        raise NotReady(
            f"{', '.join(missing)} (aws.subnet_ids, aws.security_group_ids): not in "
            f"{aws.region}: apply infra/terraform, or `gridfleet config from-terraform`"
        )


# --- what the fleet may run ---------------------------------------------------------------------------------------
def spot_quota(acct: Account) -> Answer:
    fleet = acct.config.fleet
    if not fleet.spot:
        return skipped("fleet.spot is false: no spot instances")
    per_node = max(acct.vcpus(set(fleet.instance_types)).values())
    return _quota(acct, SPOT_QUOTA, fleet.max_nodes * per_node, f"{fleet.max_nodes} nodes x {per_node} vCPUs")


def on_demand_quota(acct: Account) -> Answer:
    """Nodes on demand (fleet.spot false, or spot's fallback) count there, and so do the hub and the NAT instance."""
    fleet, aws = acct.config.fleet, acct.config.aws
    if fleet.spot and not fleet.on_demand_fallback:
        return skipped("fleet.spot without fleet.on_demand_fallback: no node runs on demand")
    hub = acct.template_data(aws.hub_launch_template).get("InstanceType") if aws.hub_launch_template else None
    others = {"the hub": hub if isinstance(hub, str) and INSTANCE_TYPE.fullmatch(hub) else None}
    others["the NAT instance"] = acct.nat[1] if acct.nat else None
    counts = acct.vcpus(set(fleet.instance_types) | {t for t in others.values() if t})
    per_node = max(counts[t] for t in fleet.instance_types)
    need = fleet.max_nodes * per_node + sum(counts[t] for t in others.values() if t)
    why = [f"{fleet.max_nodes} nodes x {per_node} vCPUs", *(f"{w} ({t}, {counts[t]})" for w, t in others.items() if t)]
    return _quota(acct, ON_DEMAND_QUOTA, need, " + ".join(why))


def _quota(acct: Account, quota: tuple[str, str], need: int, why: str) -> Answer:
    code, name = quota
    value, which = ec2_quota(acct, code)
    said = f"{name} ({code}, {which} value) is {value:g} vCPUs; the fleet needs {need} ({why})"
    if value < need:
        increase = f"--service-code ec2 --quota-code {code} --desired-value {need}"
        return fail(f"{said}: `aws service-quotas request-service-quota-increase {increase}`, or lower fleet.max_nodes")
    return ok(said)


def ec2_quota(acct: Account, code: str) -> tuple[float, str]:
    """An EC2 quota's applied value, else its default: Service Quotas answers GetServiceQuota with
    NoSuchResourceException when it holds no applied value for a quota, and AWS's default is what applies then."""
    sq = acct.client("service-quotas")
    try:
        quota, which = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code).get("Quota") or {}, "applied"
    except ClientError as e:
        if error_code(e) != "NoSuchResourceException":
            raise
        quota, which = sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code).get("Quota") or {}, "default"
    value = quota_value(quota.get("Value"))
    if value is None:
        raise NotReady(f"Service Quotas gave no value for the EC2 quota {code}")
    return value, which


def lambda_concurrency(acct: Account) -> Answer:
    """The starter and the watchdog exist and can run: none reserves 0, and what they reserve leaves AWS's 100."""
    lam, stack = acct.client("lambda"), acct.config.aws.stack
    reserved: dict[str, int | None] = {}
    missing = []
    for name in (f"{stack}-starter", f"{stack}-watchdog"):
        try:
            value = lam.get_function_concurrency(FunctionName=name).get("ReservedConcurrentExecutions")
        except ClientError as e:
            if error_code(e) != "ResourceNotFoundException":
                raise
            missing.append(name)
            continue
        if value is not None and not (whole(value) and value >= 0):
            raise NotReady(f"Lambda gave no reserved concurrency for {name}")
        reserved[name] = value
    if missing:
        return fail(
            f"the Lambda function(s) {', '.join(missing)}: not in {acct.config.aws.region}: apply infra/terraform"
        )
    if zero := [name for name, r in reserved.items() if r == 0]:
        return fail(
            f"{', '.join(zero)}: reserved concurrency 0, so it never runs: set lambda_reserved_concurrency to "
            "1 or more (or null: none reserved) and apply infra/terraform"
        )
    limit = lam.get_account_settings().get("AccountLimit") or {}
    total, free = limit.get("ConcurrentExecutions"), limit.get("UnreservedConcurrentExecutions")
    if not (whole(total) and whole(free)):
        raise NotReady("Lambda GetAccountSettings gave no concurrency limits")
    held = sum(r or 0 for r in reserved.values())
    said = (
        f"{' and '.join(reserved)}, {held or 'none'} reserved; the account's concurrency is {total} ({free} unreserved)"
    )
    if held and total < LAMBDA_UNRESERVED_MIN + held:
        return fail(
            f"{said}: AWS keeps {LAMBDA_UNRESERVED_MIN} executions unreserved, so the stack cannot apply "
            f"lambda_reserved_concurrency: raise the quota (Service Quotas, Lambda, Concurrent executions) "
            f"to {LAMBDA_UNRESERVED_MIN + held} or more, or set lambda_reserved_concurrency = null"
        )
    return ok(said)


def spot_role(acct: Account) -> Answer:
    if not acct.config.fleet.spot:
        return skipped("fleet.spot is false: no spot launches")
    try:
        acct.client("iam").get_role(RoleName=SPOT_ROLE)
    except ClientError as e:
        if error_code(e) != "NoSuchEntity":
            raise
        return fail(
            f"the service-linked role {SPOT_ROLE} does not exist, and spot launches need it: "
            "`aws iam create-service-linked-role --aws-service-name spot.amazonaws.com`"
        )
    return ok(f"{SPOT_ROLE} exists")


def log_groups(acct: Account) -> Answer:
    aws = acct.config.aws
    if not aws.ship_logs:
        return skipped("aws.ship_logs is false: the instances keep their logs")
    logs, found, wrong = acct.client("logs"), [], []
    for name in (aws.log_group_hub, aws.log_group_node):
        groups = logs.describe_log_groups(logGroupNamePrefix=name).get("logGroups", [])
        days = next((g.get("retentionInDays") for g in groups if g.get("logGroupName") == name), False)
        if days is False:
            wrong.append(f"{name} does not exist")
        elif not (whole(days) and days > 0):
            wrong.append(f"{name} has no retention (its logs are kept forever)")
        else:
            found.append(f"{name} ({days} days)")
    if wrong:
        return fail(f"{'; '.join(wrong)}: apply infra/terraform (log_retention_days), or set aws.ship_logs: false")
    return ok(", ".join(found))
