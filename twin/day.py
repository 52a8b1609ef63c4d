"""A stack deployed on the EC2 twin, with the demo sites on the bridge: what the day and week tests share."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from botocore.exceptions import ClientError

from embedded.demo_server import DemoServer
from twin.deploy import Deployed, deploy, node_image_parameter
from twin.instance import network
from twin.schedules import cron_at, stack_handlers
from twin.stack import TwinStack

T = TypeVar("T")
REGION = "ap-northeast-2"


def wait_until(
    check: Callable[[], T], timeout_s: float, what: str, every_s: float = 1.0, explain: Callable[[], str] | None = None
) -> T:
    """The first truthy value of `check()`; AssertionError naming `what` after `timeout_s`, followed by what
    `explain()` says of the state of things then. The loop only polls a real run on real instances (nothing here
    stands for a hang)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s:g} s" + (f"\n{explain()}" if explain else ""))
        time.sleep(every_s)


#: The starter's daily time: this long after the deployment ends (the schedule is applied again then, as an
#: operator's second apply would). Set before a deployment that outlasts it (a busy machine takes minutes), the
#: first run would be a day ahead of the real clock, and CloudWatch Logs, moto's as AWS's, refuses events more
#: than two hours ahead: the day's logs would all be refused.
START_AFTER_S = 120.0


class TwinDay:
    """`with TwinDay(root, stack, fleet, sites):` the twin up, the stack deployed, its schedules loaded."""

    def __init__(
        self,
        root: Path,
        stack: str,
        fleet: dict[str, Any],
        sites: dict[str, str],
        *,
        variables: dict[str, Any] | None = None,
        ssh_user: str | None = None,
        node_image: bool = False,
    ) -> None:
        self.root, self.stack, self.fleet, self.sites = root, stack, fleet, sites
        self.node_image = node_image  # the nodes boot a node image baked for the stack; the hub a stock one
        self.run_ids: list[str] = []  # every run the starter started, in order
        self.variables = dict(variables or {})
        self.twin = TwinStack(root / "twin", region=REGION, stack=stack, ssh_key=self._ssh_key(ssh_user))
        self.demo = DemoServer(host=network.HOST_ADDRESS, port=network.WEB_PORT)
        self.deployed: Deployed | None = None

    def _ssh_key(self, user: str | None) -> tuple[str, str] | None:
        """A key pair for SSH to the instances (`self.ssh_private_key`), or None."""
        if user is None:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        self.ssh_private_key = self.root / "ssh-key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.ssh_private_key)], check=True)
        return user, self.ssh_private_key.with_suffix(".pub").read_text().strip()

    def site_specs(self, sites: dict[str, str]) -> list[dict[str, Any]]:
        """fleet.yaml's sites: name -> path on the demo server (`/api/...`: the api crawler, else `links`)."""
        base, opts = self.demo.base_url, {"item": "a.item", "next": "a.next", "max_pages": 10}
        return [
            {"id": n, "start_url": base + p, "crawler": "api"}
            if p.startswith("/api/")
            else {"id": n, "start_url": base + p, "crawler": "links", "options": opts}
            for n, p in sites.items()
        ]

    def put_config(self, sites: dict[str, str], **sections: dict[str, Any]) -> None:
        """The operator's change between days: fleet.yaml with these sites (and sections merged over its own),
        uploaded as the hub's config."""
        doc = self.config
        for name, values in sections.items():
            doc[name] = {**doc.get(name, {}), **values}
        doc["sites"] = self.site_specs(sites)
        key = doc["aws"].get("hub_config_key", "hub/fleet.yaml")
        self.twin.client("s3").put_object(Bucket=doc["aws"]["bucket"], Key=key, Body=yaml.safe_dump(doc).encode())

    def __enter__(self) -> TwinDay:
        self.twin.start()
        try:
            self.demo.start()
            self._deploy()
            self.twin.run()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _deploy(self) -> None:
        start = cron_at(self.twin.clock.now() + START_AFTER_S)
        variables = {"name_prefix": self.stack, "bucket_name": f"{self.stack}-results", "start_schedule": start}
        fleet = {**self.fleet, "sites": self.site_specs(self.sites)}
        variables = {**variables, **self.variables}
        self.deployed = deploy(self.twin, self.root / "operator", fleet, variables, node_image=self.node_image)
        rule = f"{self.stack}-start"
        self.twin.client("events").put_rule(
            Name=rule, ScheduleExpression=cron_at(self.twin.clock.now() + START_AFTER_S), State="ENABLED"
        )
        self.twin.load_schedules(stack_handlers(self.twin.lambda_clients, self.twin.clock), prefix=self.stack)

    def ensure_deployed(self) -> None:
        """Deploy the stack again when it is gone: moto's state is this process's, and a test that resets it
        (moto's `mock_aws` does) takes the stack with it."""
        try:
            self.twin.client("s3").head_bucket(Bucket=self.config["aws"]["bucket"])
        except ClientError:
            with self.twin.paused():
                self._deploy()
            self.run_ids.clear()  # their records and summaries went with moto's state

    def __exit__(self, *exc: object) -> None:
        self.twin.stop()
        self.demo.stop()
        for box in (self.root / "twin" / "instances").glob("i-*"):  # what each instance logged, kept for a reader
            keep = self.root / "instance-logs" / box.name
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy2(box / "boot.log", keep / "boot.log")
            shutil.copytree(box / "var-log", keep / "var-log", dirs_exist_ok=True, ignore_dangling_symlinks=True)
        shutil.rmtree(self.root / "twin", ignore_errors=True)

    # --- driving ----------------------------------------------------------------------------------
    def start_rule(self) -> Any:
        return next(t for t in self.twin.schedules.timers if t.rule == f"{self.stack}-start")

    def start_by_schedule(self) -> str:
        """Move the twin's clock to the starter's next time; the run id of the hub it started."""
        n = len(self.twin.fired)
        self.twin.clock.jump(self.start_rule().next_at)
        fired = wait_until(
            lambda: [f for f in self.twin.fired[n:] if f.rule == f"{self.stack}-start"], 30, "starter firing"
        )
        assert fired[0].error is None and fired[0].result["action"] == "started", fired[0]
        self.run_ids.append(str(fired[0].result["run_id"]))
        return self.run_ids[-1]

    def restart_by_watchdog(self, passes: int = 4) -> dict[str, Any]:
        """Move the twin's clock to the watchdog's passes (one that sees the hub heartbeat, one `hub_stale_s` later
        that sees it unchanged) until one restarts a hub; that pass's answer. AssertionError if none did."""
        seen_passes = []
        for _ in range(passes):
            rule = next(t for t in self.twin.schedules.timers if t.rule == f"{self.stack}-watchdog")
            seen = len(self.twin.fired)
            self.twin.clock.jump(rule.next_at)

            def fired(n: int = seen, r: str = rule.rule) -> list[Any]:
                return [f for f in self.twin.fired[n:] if f.rule == r]

            new = wait_until(fired, 60, "a pass")
            seen_passes.append(new[-1])  # appended once its handler returned
            if seen_passes[-1].result and seen_passes[-1].result.get("restarted"):
                return dict(seen_passes[-1].result)
        raise AssertionError(
            f"no hub started after the watchdog's passes: {[(f.result, f.error) for f in seen_passes]}"
        )

    def launch_from(self, role: str, image_id: str) -> None:
        """The `role` ("hub" or "node") launch template's default version now names `image_id`, as an operator's
        apply with another `hub_ami_parameter` or `node_ami_parameter` leaves it."""
        ec2, name = self.twin.client("ec2"), self.config["aws"][f"{role}_launch_template"]
        [current] = ec2.describe_launch_template_versions(LaunchTemplateName=name, Versions=["$Default"])[
            "LaunchTemplateVersions"
        ]
        data = {**current["LaunchTemplateData"], "ImageId": image_id}  # all of it: moto copies no source version
        made = ec2.create_launch_template_version(LaunchTemplateName=name, LaunchTemplateData=data)
        version = made["LaunchTemplateVersion"]["VersionNumber"]
        ec2.modify_launch_template(LaunchTemplateName=name, DefaultVersion=str(version))

    # --- reading ----------------------------------------------------------------------------------
    def node_image_id(self) -> str:
        """The AMI id of the node image baked for the stack (`node_image=True`)."""
        name = node_image_parameter(self.stack)
        return str(self.twin.client("ssm").get_parameter(Name=name)["Parameter"]["Value"])

    @property
    def config(self) -> dict[str, Any]:
        assert self.deployed is not None
        return self.deployed.config

    def site_item(self, site: str, run_id: str) -> dict[str, Any] | None:
        ddb = self.twin.client("dynamodb")
        out = ddb.get_item(
            TableName=self.config["aws"]["table"],
            Key={"run_id": {"S": run_id}, "Site": {"S": site}},
            ConsistentRead=True,
        )
        item = out.get("Item")
        return {k: next(iter(v.values())) for k, v in item.items()} if item else None

    def node_of(self, site: str, run_id: str, run_status: str, min_pages: int = 0) -> str | None:
        """The node of the site's attempt, once its run_status is `run_status` with `min_pages` crawled."""
        item = self.site_item(site, run_id) or {}
        if item.get("run_status") == run_status and int(item.get("pages") or 0) >= min_pages:
            return str(item["instance_id"])
        return None

    def instances(self) -> list[dict[str, Any]]:
        ec2 = self.twin.client("ec2")
        f = [{"Name": "tag:gridfleet:stack", "Values": [self.stack]}]
        return [i for r in ec2.describe_instances(Filters=f)["Reservations"] for i in r["Instances"]]

    def instance_states(self) -> dict[str, str]:
        return {i["InstanceId"]: i["State"]["Name"] for i in self.instances()}

    def stack_idle(self) -> bool:
        states = self.instance_states()
        ec2twin = self.twin.ec2twin
        assert ec2twin is not None  # a deployed stack runs its instances
        return bool(states) and set(states.values()) == {"terminated"} and not ec2twin.running

    def processes(self) -> str:
        """The instances this twin runs and, for each, the state of every process in it: what a day that does not
        end is looked into with (a step of a boot script that neither succeeds nor fails, a hung crawl)."""
        ec2twin = self.twin.ec2twin
        assert ec2twin is not None
        lines = [f"instance states: {self.instance_states()}", *self.open_sites()]
        for iid, run in list(ec2twin.running.items()):
            lines.append(f"{iid} ({run.spec.role}), booted {run.boots} time(s); its processes (pid state wchan argv):")
            lines += [f"  {network.describe(pid)}" for pid in run.sandbox.processes()]
        for box in sorted((self.root / "twin" / "instances").glob("i-*")):  # running or not: how each boot went
            log = box / "var-log" / "gridfleet-boot.log"
            tail = log.read_text(errors="replace").splitlines()[-6:] if log.is_file() else ["(no boot log)"]
            lines += [f"{box.name}'s boot log, its end:", *(f"  {line[:300]}" for line in tail)]
        return "\n".join(lines)

    def open_sites(self) -> list[str]:
        """The latest run's sites that are not done, as the table has them: where a run that does not end waits."""
        if not self.run_ids:
            return []
        ddb = self.twin.client("dynamodb")
        out = ddb.query(
            TableName=self.config["aws"]["table"],
            KeyConditionExpression="run_id = :r",
            ExpressionAttributeValues={":r": {"S": self.run_ids[-1]}},
            ConsistentRead=True,
        )
        keep = ("run_status", "site_status", "attemptCount", "enqueued", "retry_at", "instance_id", "failure_class")
        lines = []
        for item in out.get("Items", []):
            plain = {k: next(iter(v.values())) for k, v in item.items() if k in (*keep, "Site")}
            if plain.get("run_status") in ("QUEUED", "RUN"):
                lines.append(
                    f"open site of {self.run_ids[-1]}: " + ", ".join(f"{k}={plain.get(k)}" for k in ("Site", *keep))
                )
        return lines

    def _run_object(self, run_id: str, name: str) -> bytes | None:
        """runs/<run_id>/<name> in the stack's bucket, or None while it is not there."""
        s3 = self.twin.client("s3")
        try:
            return bytes(s3.get_object(Bucket=self.config["aws"]["bucket"], Key=f"runs/{run_id}/{name}")["Body"].read())
        except s3.exceptions.NoSuchKey:
            return None

    def summary(self, run_id: str) -> dict[str, Any] | None:
        body = self._run_object(run_id, "summary.json")
        return dict(json.loads(body)) if body is not None else None

    def report(self, run_id: str) -> str | None:
        body = self._run_object(run_id, "report.html")
        return body.decode() if body is not None else None

    def figures(self, run_id: str, boots: list[Any]) -> dict[str, float]:
        """The starter's firing to the hub's first node launch, and each node's launch to its first claim (as
        this machine's clock measures them)."""
        fired = next(f for f in self.twin.fired if f.rule == f"{self.stack}-start" and f.result["run_id"] == run_id)
        hub = next(b for b in boots if b.role == "hub")
        nodes = [b for b in boots if b.role == "node"]
        claims: dict[str, float] = {}
        for s in (self.summary(run_id) or {}).get("sites", {}).values():
            for a in s["attempts"]:
                claims[a["instance_id"]] = min(claims.get(a["instance_id"], a["start"]), a["start"])
        first_node = min(b.launched_at for b in nodes)
        to_claim = [claims[b.instance_id] - b.instance_offset - b.launched_at for b in nodes if b.instance_id in claims]
        return {
            "schedule_to_first_launch_s": round(first_node - (fired.at - hub.clock_offset), 1),
            "node_launch_to_first_claim_s": round(min(to_claim), 1),
            "node_launch_to_first_claim_max_s": round(max(to_claim), 1),
        }
