"""infra/terraform applied to moto: the stack a day of the EC2 twin runs in, as the .tf files define it.

`apply_stack(clients, terraform_dir, variables)` reads the directory with python-hcl2, evaluates its expressions
(`expressions`) and makes each resource through boto3 clients for the caller's endpoint (`resources`,
`launch`). Every value comes from the .tf files and the variables (their defaults in variables.tf, the
caller's overrides): nothing is retyped here. A resource is made when the apply reaches it in file order or
when an expression of another needs it first, so references order the calls as they order Terraform's graph.

Made: the VPC, both subnet sets, the security groups and every rule (the default allow-all egress EC2 adds
removed, as Terraform removes it; the VPC's default group emptied), the KMS key and alias, EFS (file system,
lifecycle, mount targets, access point, file-system policy), the IAM roles with their trust and inline
policies, the instance profiles, the table, the queues, the buckets with versioning, the SNS topics, the log
groups, both launch templates, both Lambdas, their permissions, and the EventBridge rules and targets.

Skipped (`SKIPPED`; an expression that needs one of these fails, naming it): what routes and translates
traffic (internet gateway, route tables and routes, VPC endpoints, the NAT instance and its Elastic IP), flow
logs, EFS backups, the Spot service-linked role, the buckets' settings other than versioning (ownership,
public access block, encryption, lifecycle, notifications, access logging, policies: moto enforces none), the
DLQ's redrive-allow policy (moto keeps none), alarms, their e-mail subscription and the dashboard. Table
point-in-time recovery and the key's deletion window are not applied either.

Data sources are read as `data` says (moto's identity, the AMI, policy documents, the Lambda package).

The variables' validation blocks are not evaluated. Applying a stack whose VPC (tagged with the stack's
name) is already on the endpoint is refused: an apply makes, it never updates.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from twin.terraform import launch  # noqa: F401  (its creators register themselves in KINDS
from twin.terraform.data import DataReader
from twin.terraform.expressions import Body, Evaluator, Namespace, TfError, TfModule, Where
from twin.terraform.resources import KINDS, SKIPPED, ClientSource, Ctx, Kind

__all__ = ["SKIPPED", "StackOutputs", "TfError", "apply_stack"]

#: Meta-arguments and blocks of a resource that are not its settings.
_META = frozenset({"count", "for_each", "depends_on", "lifecycle", "provider", "provisioner", "connection"})
#: The name a hub user-data given as text has inside the evaluation (`filebase64` reads it).
HUB_USER_DATA = "<hub user-data>"
#: The arguments that hold an IAM policy document.
_POLICY_ARGUMENTS = frozenset({"policy", "assume_role_policy"})


@dataclass(frozen=True)
class StackOutputs:
    """What the rest of the twin needs of an applied stack."""

    name_prefix: str
    region: str
    vpc_id: str
    private_subnet_ids: tuple[str, ...]
    hub_security_group_id: str
    node_security_group_id: str
    efs_id: str
    hub_launch_template: str
    hub_launch_template_id: str
    node_launch_template: str
    node_launch_template_id: str
    hub_role: str
    node_role: str
    hub_instance_profile: str
    node_instance_profile: str
    starter_function: str
    watchdog_function: str
    start_rule: str
    watchdog_rule: str
    table: str
    queue: str
    dlq: str
    bucket: str
    notify_topic_arn: str
    hub_log_group: str
    node_log_group: str
    #: outputs.tf's `gridfleet_aws`: the aws: section of fleet.yaml for this stack.
    gridfleet_aws: Mapping[str, Any]
    #: Every IAM policy document of the stack as AWS receives it, by `<type>.<name>.<argument>` (a role's trust
    #: policy, an inline policy, the key's policy, a bucket's or the file system's policy), those of resources
    #: the twin skips included: what a linter reads.
    policies: Mapping[str, str]


def _variables(module: TfModule, given: Mapping[str, Any]) -> dict[str, Any]:
    """Each variable's value: the caller's, else its default in variables.tf (a literal)."""
    unknown = sorted(set(given) - set(module.variables))
    if unknown:
        raise TfError(f"{module.directory}: no variable {unknown[0]} is declared")
    plain = Evaluator(module, {})
    values: dict[str, Any] = {}
    for name, body in module.variables.items():
        if name in given:
            values[name] = given[name]
        elif "default" in body.attrs:
            values[name] = plain.evaluate(body.attrs["default"], Where(body.file, f"variable {name}"))
        else:
            raise TfError(f"{body.file}:{body.line}: variable {name} has no default and was not given")
    return values


class _Stack:
    """The evaluation of one module against one endpoint: each local, data source and resource once."""

    def __init__(self, module: TfModule, clients: ClientSource, variables: Mapping[str, Any], **extra: Any) -> None:
        self.module = module
        self.clients = clients
        self.values: dict[tuple[str, ...], Any] = {}
        self._busy: list[tuple[str, ...]] = []
        roots: dict[str, Any] = {
            "var": _variables(module, variables),
            "local": Namespace("local", self.local),
            "data": Namespace("data", lambda t: Namespace(f"data.{t}", partial(self.datum, t))),
            "path": {"module": str(module.directory), "root": str(module.directory), "cwd": str(Path.cwd())},
        }
        for rtype in {t for t, _ in module.resources}:
            roots[rtype] = Namespace(rtype, partial(self.resource, rtype))
        self.ev = Evaluator(module, roots, extra.get("files"))
        identity = clients.client("sts").get_caller_identity()
        region = clients.client("ec2").meta.region_name
        self.ctx = Ctx(clients, region, identity["Account"], "aws", self._default_tags())
        self.reader = DataReader(clients, self.ctx, extra.get("ami_id"), extra.get("lambda_package"))
        if region != roots["var"]["region"]:
            raise TfError(f"variables.tf: region is {roots['var']['region']} but the clients are in {region}")

    def _default_tags(self) -> dict[str, str]:
        tags: dict[str, str] = {}
        for provider in self.module.providers:
            for kind, _, body in provider.blocks:
                if kind == "default_tags" and "tags" in body.attrs:
                    tags.update(self.ev.evaluate(body.attrs["tags"], Where(body.file, "provider aws default_tags")))
        return tags

    @contextmanager
    def _making(self, key: tuple[str, ...], label: str) -> Iterator[None]:
        if key in self._busy:
            cycle = " -> ".join(".".join(k) for k in [*self._busy[self._busy.index(key) :], key])
            raise TfError(f"{label}: refers to itself: {cycle}")
        self._busy.append(key)
        try:
            yield
        finally:
            self._busy.pop()

    def local(self, name: str) -> Any:
        key = ("local", name)
        if key not in self.values:
            if name not in self.module.locals:
                raise TfError(f"{self.module.directory}: no local {name} is defined")
            file, tree = self.module.locals[name]
            with self._making(key, f"local.{name}"):
                self.values[key] = self.ev.evaluate(tree, Where(file, f"local.{name}"))
        return self.values[key]

    def arguments(self, body: Body, where: Where, scope: Mapping[str, Any]) -> dict[str, Any]:
        """A block's settings: attributes evaluated, nested blocks as lists of their settings."""
        out = {k: self.ev.evaluate(t, where, scope) for k, t in body.attrs.items() if k not in _META}
        for kind, _, inner in body.blocks:
            if kind == "dynamic":
                raise TfError(f"{where.file}:{inner.line}: {where.block}: dynamic blocks are not evaluated by the twin")
            if kind not in _META:
                out.setdefault(kind, []).append(self.arguments(inner, where, scope))
        return out

    # --- data sources --------------------------------------------------------------------------------------

    def datum(self, dtype: str, name: str) -> Any:
        key = ("data", dtype, name)
        if key not in self.values:
            body = self.module.data.get((dtype, name))
            if body is None:
                raise TfError(f"{self.module.directory}: no data source {dtype}.{name} is defined")
            where = Where(body.file, f"data.{dtype}.{name}")
            with self._making(key, where.block):
                args = self.arguments(body, where, {})
                read = getattr(self.reader, f"read_{dtype}", None)
                if read is None:
                    raise TfError(f"{body.file}:{body.line}: {where.block}: the twin does not read {dtype}")
                try:
                    self.values[key] = {**args, **read(args, where)}
                except (ClientError, BotoCoreError) as e:
                    raise TfError(f"{body.file}:{body.line}: {where.block}: {e}") from None
        return self.values[key]

    # --- resources --------------------------------------------------------------------------------------

    def resource(self, rtype: str, name: str) -> Any:
        """A resource's attributes (a dict of them by key for for_each, a list for count), made on first use."""
        key = (rtype, name)
        if key not in self.values:
            body = self.module.resources.get(key)
            if body is None:
                raise TfError(f"{self.module.directory}: no resource {rtype}.{name} is defined")
            where = Where(body.file, f"{rtype}.{name}")
            if rtype in SKIPPED:
                raise TfError(f"{body.file}:{body.line}: {where.block} is needed but not made ({SKIPPED[rtype]})")
            kind = KINDS.get(rtype)
            if kind is None:
                raise TfError(f"{body.file}:{body.line}: {where.block}: the twin does not make {rtype} resources")
            with self._making(key, where.block):
                self.values[key] = self._instances(kind, body, where)
        return self.values[key]

    def _instances(self, kind: Kind, body: Body, where: Where) -> Any:
        made = {
            key: self._make(kind, body, Where(where.file, f"{where.block}{label}"), scope)
            for key, label, scope in self._scopes(body, where)
        }
        if "count" in body.attrs:
            return list(made.values())
        return made if "for_each" in body.attrs else made[None]

    def _scopes(self, body: Body, where: Where) -> list[tuple[Any, str, dict[str, Any]]]:
        """A resource's instances: each one's key (None for a single resource), its label after the resource's
        address (`[0]`, `["hub"]`) and the scope its arguments are evaluated in."""
        if "count" in body.attrs:
            n = self.ev.evaluate(body.attrs["count"], where)
            return [(i, f"[{i}]", {"count": {"index": i}}) for i in range(n)]
        if "for_each" in body.attrs:
            each = self.ev.evaluate(body.attrs["for_each"], where)
            pairs = each.items() if isinstance(each, Mapping) else ((v, v) for v in each)
            return [(k, f'["{k}"]', {"each": {"key": k, "value": v}}) for k, v in sorted(pairs)]
        return [(None, "", {})]

    def _make(self, kind: Kind, body: Body, where: Where, scope: Mapping[str, Any]) -> dict[str, Any]:
        args = self.arguments(body, where, scope)
        unknown = sorted(k for k, v in args.items() if v not in (None, []) and k not in kind.uses | kind.ignores)
        if unknown:
            raise TfError(f"{where.file}:{body.line}: {where.block}: the twin does not apply {', '.join(unknown)}")
        try:
            made = kind.create(self.ctx, args)
        except (ClientError, BotoCoreError) as e:
            raise TfError(f"{where.file}:{body.line}: {where.block}: {' '.join(str(e).split())}") from None
        except (KeyError, ValueError) as e:
            raise TfError(f"{where.file}:{body.line}: {where.block}: {e}") from None
        return {**args, **made}

    # --- the whole stack -----------------------------------------------------------------------------------

    def refuse_if_applied(self) -> None:
        prefix = self.ev.roots["var"]["name_prefix"]
        tag = self.local("tag_stack")
        filters = [{"Name": f"tag:{tag}", "Values": [prefix]}]
        found = self.clients.client("ec2").describe_vpcs(Filters=filters)["Vpcs"]
        if found:
            raise TfError(
                f"stack {prefix} is already applied on this endpoint ({found[0]['VpcId']} has {tag}={prefix})"
            )

    def apply(self) -> None:
        for rtype, name in self.module.resources:
            if rtype not in SKIPPED:
                self.resource(rtype, name)

    def output(self, name: str) -> Any:
        body = self.module.outputs[name]
        return self.ev.evaluate(body.attrs["value"], Where(body.file, f"output.{name}"))

    def outputs(self) -> StackOutputs:
        r = self.resource
        aws = self.output("gridfleet_aws")
        return StackOutputs(
            name_prefix=aws["stack"],
            region=aws["region"],
            vpc_id=r("aws_vpc", "main")["id"],
            private_subnet_ids=tuple(aws["subnet_ids"]),
            hub_security_group_id=r("aws_security_group", "hub")["id"],
            node_security_group_id=r("aws_security_group", "node")["id"],
            efs_id=aws["efs_id"],
            hub_launch_template=aws["hub_launch_template"],
            hub_launch_template_id=r("aws_launch_template", "hub")["id"],
            node_launch_template=aws["node_launch_template"],
            node_launch_template_id=r("aws_launch_template", "node")["id"],
            hub_role=r("aws_iam_role", "hub")["name"],
            node_role=r("aws_iam_role", "node")["name"],
            hub_instance_profile=self.output("hub_instance_profile"),
            node_instance_profile=self.output("node_instance_profile"),
            starter_function=r("aws_lambda_function", "starter")["function_name"],
            watchdog_function=r("aws_lambda_function", "watchdog")["function_name"],
            start_rule=r("aws_cloudwatch_event_rule", "start")["name"],
            watchdog_rule=r("aws_cloudwatch_event_rule", "watchdog")["name"],
            table=aws["table"],
            queue=aws["queue"],
            dlq=aws["dlq"],
            bucket=aws["bucket"],
            notify_topic_arn=self.output("notify_topic_arn"),
            hub_log_group=self.output("hub_log_group"),
            node_log_group=self.output("node_log_group"),
            gridfleet_aws=aws,
            policies=self.policies(),
        )

    def policies(self) -> dict[str, str]:
        """The policy documents of every resource, evaluated from its .tf arguments (an instance of a resource
        with `count` or `for_each` as `<type>.<name>[<key>].<argument>`)."""
        out: dict[str, str] = {}
        for (rtype, name), body in self.module.resources.items():
            where = Where(body.file, f"{rtype}.{name}")
            for argument in sorted(_POLICY_ARGUMENTS & set(body.attrs)):
                for _, label, scope in self._scopes(body, where):
                    out[f"{rtype}.{name}{label}.{argument}"] = self.ev.evaluate(body.attrs[argument], where, scope)
        return out


def apply_stack(
    clients: ClientSource,
    terraform_dir: Path | str,
    variables: Mapping[str, Any],
    *,
    hub_user_data: str | Path | None = None,
    ami_id: str | None = None,
    lambda_package: bytes | None = None,
) -> StackOutputs:
    """Make on the clients' endpoint the stack `terraform_dir` defines, with `variables` over its defaults.

    `hub_user_data` is the hub's cloud-config (`gridfleet render hub --config fleet.yaml`), as text or a path;
    without it the .tf's own file is read. `ami_id` stands in for the AMI parameter when moto lacks it;
    `lambda_package` goes into the bucket when it has no Lambda package (a placeholder otherwise). Raises
    `TfError` (one line: file, line, block, what) for what cannot be evaluated or made, and when the stack
    is already on the endpoint.
    """
    module = TfModule(Path(terraform_dir))
    variables = dict(variables)
    files: dict[str, bytes] = {}
    if isinstance(hub_user_data, Path):
        variables["hub_user_data_file"] = str(hub_user_data)
    elif hub_user_data is not None:
        files[HUB_USER_DATA] = hub_user_data.encode()
        variables["hub_user_data_file"] = HUB_USER_DATA
    stack = _Stack(module, clients, variables, files=files, ami_id=ami_id, lambda_package=lambda_package)
    stack.refuse_if_applied()
    stack.apply()
    return stack.outputs()
