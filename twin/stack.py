"""The EC2 twin as one thing that starts and stops: its AWS (a moto server on the bridge), the instances moto
starts booted for real, and the stack's schedules firing (root only).

`TwinStack.start()` brings up the bridge and a moto server in this process on the bridge's host address, so
instances reach it and the twin can read and change moto's state. A loop thread then, every `tick_s`:

- keeps moto's instances and the sandboxes in step (`Ec2Twin.sync`): each instance moto starts boots its
  user-data in an `InstanceSandbox` whose AWS CLI and SDKs reach this moto with the credentials its IMDS gives
  for its instance profile's role; moto is told the instance's address on the bridge and its launch time on
  the twin's clock, so what the code reads back from EC2 is where and when the instance really is; an
  instance of a baked node image (`bake_node_image`: infra/packer's bake script run once, an AMI id in moto)
  starts with what the bake left (`twin.instance.images`); the security groups it was launched in filter its traffic
  as EC2's do, each instance's rules rebuilt as instances come and go (`twin.instance.firewall`);
- runs the SSM commands sent to instances whose SSM agent runs inside them (`twin.ssm`; the agent is
  the twin's stand-in package, which the twin's S3 serves where AWS serves the real one: `twin.instance.standins`);
  with `ssh_key`, every instance also runs a real sshd that admits that key (`twin.instance.sshd`); each
  instance's console, where cloud-init prints its host keys when its final stage gets there, is what
  GetConsoleOutput answers;
- fires the stack's EventBridge schedules on the twin's clock (`twin.schedules`), the Lambda handlers
  called in this process; a schedule's times that a jump of the clock passed over fire once.

The twin's clock is this machine's, moved ahead by `TwinClock.jump`: a week of daily runs takes minutes. After
a jump to another day, an instance runs with its wall clock as far ahead (`InstanceSandbox(clock_offset_s=)`:
a preload library of ours moves the wall clock of every process of the instance, not its monotonic clock), so
the times it writes agree with the Lambdas'; an instance's offset is fixed at its boot, so the twin jumps a day
only while nothing runs. CloudWatch Logs, which takes an event from 14 days before its own now to 2 hours after,
has the twin's clock for its now (`logs_on_twin_clock`), as AWS's is the day the instances live in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

from embedded.moto_server import make_dynamodb_writes_atomic
from twin.account import AccountLimits, publish_debian_images
from twin.account import install as install_limits
from twin.ec2twin import Ec2Twin, InstanceSpec
from twin.instance import network
from twin.instance.firewall import Firewalls
from twin.instance.sandbox import InstanceSandbox
from twin.instance.sshd import publish_instance_console, start_sshd
from twin.instance.standins import efs_utils_deb, publish_ssm_agent
from twin.ssm import TwinSsmAgent

log = logging.getLogger("gridfleet.twin")

ACCOUNT = "123456789012"  # moto's default account
#: An offset smaller than this is left as clock skew (the code's time thresholds are minutes), so instances
#: keep this machine's clock; a larger one (a jump to another day) is the instances' clock too.
FAKE_CLOCK_FROM_S = 300.0
CREDENTIALS = {"aws_access_key_id": "twin", "aws_secret_access_key": "twin"}  # moto takes any
#: How long an instance's processes have, after the SIGTERM of its shutdown or termination, before SIGKILL.
STOP_GRACE_S = 20.0


class TwinClock:
    """This machine's clock moved `offset` seconds ahead; `jump()` moves it further (never back).

    `instance_offset` is how far ahead the clock of an instance booted now runs: the offset as of the last jump
    of `FAKE_CLOCK_FROM_S` or more (a jump to another day); smaller jumps (e.g. to a watchdog pass) are clock
    skew between the Lambdas and the instances, of the kind the code's minute-sized thresholds tolerate."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = float(offset)
        self.instance_offset = self.offset if self.offset >= FAKE_CLOCK_FROM_S else 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def jump(self, to: float) -> None:
        """Move the clock ahead to the epoch `to` (a no-op when it is there already)."""
        step = to - self.now()
        if step <= 0:
            return
        self.offset += step
        if step >= FAKE_CLOCK_FROM_S:
            self.instance_offset = self.offset


@dataclass
class Boot:
    """How one instance booted: when moto started it and when the twin did (this machine's clock), and how
    far ahead of this machine's clock the twin's and the instance's ran then."""

    instance_id: str
    role: str | None
    launched_at: float
    booted_at: float
    clock_offset: float
    instance_offset: float
    sandbox: InstanceSandbox

    @property
    def baked(self) -> bool:
        """Launched from a baked node image."""
        return self.sandbox.image is not None


@contextlib.contextmanager
def logs_on_twin_clock(clock: TwinClock) -> Iterator[None]:
    """moto's CloudWatch Logs judges an event's time by `clock` while in the block (this process's moto only:
    its now is read by its models module alone)."""
    from moto.logs import models

    real = models.utcnow
    models.utcnow = lambda: real() + timedelta(seconds=clock.offset)
    try:
        yield
    finally:
        models.utcnow = real


@dataclass
class TwinStack:
    root: Path
    region: str = "ap-northeast-2"
    stack: str | None = None  # only this stack's instances (gridfleet:stack)
    clock: TwinClock = field(default_factory=TwinClock)
    tick_s: float = 0.5
    moto_port: int = 0
    stock_users: tuple[str, ...] = ("gridfleet",)  # the host's crawl user is not on a stock image
    ssh_key: tuple[str, str] | None = None  # (user, public key): every instance runs sshd and admits that key
    boots: list[Boot] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # what `Ec2Twin.sync` did, one line each
    fired: list[Any] = field(default_factory=list)  # every schedule that fired (`twin.schedules.Fired`)
    images: dict[str, Any] = field(default_factory=dict)  # AMI id -> its `BakedImage`
    limits: AccountLimits = field(default_factory=AccountLimits)  # the account's quotas (`twin.account`)

    def __post_init__(self) -> None:
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self.ec2twin: Ec2Twin | None = None
        self.ssm: TwinSsmAgent | None = None
        self.schedules: Any = None
        self.firewalls: Firewalls | None = None
        self._consoles: dict[str, int] = {}  # instance id -> the console's size when last published
        self._patches = contextlib.ExitStack()  # what start() changed of moto in this process, undone by stop()

    # --- AWS --------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the twin is not started")
        host, port = self._server.get_host_and_port()
        return f"http://{host}:{port}"

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, region_name=self.region, endpoint_url=self.endpoint, **CREDENTIALS)

    def lambda_clients(self, settings: Any) -> Any:
        """The clients a Lambda handler of the stack gets (`lambdas.runtime`'s, on the twin's AWS): the role's
        credentials a Lambda has are, here, any that moto takes."""
        from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
        from fleet.config.aws import AwsConfig

        aws = AwsConfig(region=settings.region, endpoint_url=self.endpoint, table=settings.table)
        return AwsClients(aws, credentials=LOCAL_CREDENTIALS)

    def ec2_backend(self) -> Any:
        from moto.ec2.models import ec2_backends

        return ec2_backends[ACCOUNT][self.region]

    # --- life -------------------------------------------------------------------------------------
    def start(self) -> TwinStack:
        from moto.server import ThreadedMotoServer

        if os.geteuid() != 0:
            raise RuntimeError("the EC2 twin needs root (network and mount namespaces)")
        network.cleanup_leftovers()
        network.ensure_bridge()
        install_limits(self.limits)  # before moto's server makes its routes
        make_dynamodb_writes_atomic()  # conditional writes atomic, as DynamoDB's are
        self._patches.enter_context(logs_on_twin_clock(self.clock))
        self.root.mkdir(parents=True, exist_ok=True)
        self._server = ThreadedMotoServer(ip_address=network.HOST_ADDRESS, port=self.moto_port, verbose=False)
        self._server.start()
        # moto's state is this process's, shared by every moto server it runs: the twin's AWS starts empty
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=30)
        self.firewalls = Firewalls(self.client("ec2"), exempt=[self._server.get_host_and_port()])
        self.ec2twin = Ec2Twin(
            self.client("ec2"),
            self._boot,
            stack=self.stack,
            stop_grace_s=STOP_GRACE_S,
            journal=self.log,
            now=self.clock.now,
        )
        self.ssm = TwinSsmAgent.for_region(ACCOUNT, self.region, self.managed)
        publish_ssm_agent(self.client("s3"), self.region, self.root / "standins")
        publish_debian_images(self.client("ec2"), ACCOUNT, self.region)
        return self

    @property
    def efs_utils_deb(self) -> Path:
        """The twin's stand-in amazon-efs-utils package: what an operator passes to `bundle --efs-utils-deb`."""
        path = self.root / "standins" / "amazon-efs-utils_amd64.deb"
        return path if path.exists() else efs_utils_deb(path.parent)

    def load_schedules(self, handlers: dict[str, Any], prefix: str = "") -> list[Any]:
        """The stack's EventBridge rules, from now on fired by the loop on the twin's clock."""
        from twin.schedules import Schedules

        with self._lock:
            self.schedules = Schedules(self.client("events"), self.client("lambda"), handlers)
            return self.schedules.load(self.clock.now(), prefix)

    def run(self) -> TwinStack:
        """Start the loop thread."""
        self._thread = threading.Thread(target=self._loop, name="twin", daemon=True)
        self._thread.start()
        return self

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No pass of the loop runs inside this block (e.g. while the stack is deployed again)."""
        with self._lock:
            yield

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.tick_s)

    def tick(self) -> None:
        """One pass: instances, then SSM commands, then the schedules."""
        with self._lock:
            for step in (self._sync, self._ssm, self._fire):
                try:
                    step()
                except Exception as e:  # noqa: BLE001 - a pass that fails is logged and the next one tries again
                    self.errors.append(f"{type(e).__name__}: {e}")
                    log.warning("twin-tick-failed step=%s error=%s\n%s", step, e, traceback.format_exc())

    def _sync(self) -> None:
        if self.ec2twin is not None:
            self.ec2twin.sync()  # its lines go to self.log as they happen
            self._publish_consoles()

    def _publish_consoles(self) -> None:
        """GetConsoleOutput answers with each running instance's console as it is now."""
        assert self.ec2twin is not None
        for iid, run in list(self.ec2twin.running.items()):
            box = run.sandbox
            size = box.console.stat().st_size if box.console.exists() else 0  # type: ignore[attr-defined]
            if self._consoles.get(iid) != size:
                publish_instance_console(self.ec2_backend(), iid, box)  # type: ignore[arg-type]
                self._consoles[iid] = size

    def _ssm(self) -> None:
        if self.ssm is not None:
            self.ssm.poll()

    def _fire(self) -> None:
        if self.schedules is not None:
            for fired in self.schedules.fire_due(self.clock.now(), catch_up=False):
                self.fired.append(fired)
                log.info("twin-fired rule=%s at=%s error=%s", fired.rule, fired.at, fired.error)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        with self._lock:
            if self.ssm is not None:
                self.ssm.close()
            if self.ec2twin is not None:
                self.ec2twin.stop_all()
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._patches.close()
        network.cleanup_leftovers()

    def __enter__(self) -> TwinStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- instances --------------------------------------------------------------------------------
    def running(self, instance_id: str) -> InstanceSandbox | None:
        """The sandbox of a running instance of the twin, or None."""
        run = self.ec2twin.running.get(instance_id) if self.ec2twin else None
        return run.sandbox if run is not None else None  # type: ignore[return-value]

    def managed(self, instance_id: str) -> InstanceSandbox | None:
        """The sandbox of a running instance whose SSM agent runs (what SSM can deliver to), or None."""
        box = self.running(instance_id)
        return box if box is not None and box.ssm_agent_online() else None

    def _minter(self, role: str, instance_id: str) -> Callable[[], Mapping[str, str]]:
        """The credentials EC2 gives an instance of `role`: a session of the role named after the instance (its
        `aws:userid` is then `<role id>:<instance id>`), from the twin's STS."""

        def mint() -> Mapping[str, str]:
            arn = self.client("iam").get_role(RoleName=role)["Role"]["Arn"]
            sts = self.client("sts")
            return sts.assume_role(RoleArn=arn, RoleSessionName=instance_id, DurationSeconds=43200)["Credentials"]

        return mint

    def _role_of(self, profile: str | None) -> str | None:
        if not profile:
            return None
        try:
            roles = self.client("iam").get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
        except Exception:  # noqa: BLE001 - no such profile: the instance gets no credentials, as on EC2
            return None
        return roles[0]["RoleName"] if roles else None

    def bake_node_image(self, bundle: Path, parameter: str) -> str:
        """Bake a node image from `bundle` (infra/packer's bake script, in a sandbox), register it in moto and
        put its AMI id in the SSM parameter `parameter`; the AMI id. Instances launched from it boot on it."""
        from twin.instance.bake import bake, register

        image = bake(self.root, bundle, self.efs_utils_deb, endpoint=self.endpoint, region=self.region,
                     stock_users=self.stock_users)  # fmt: skip
        ami = register(self.client("ec2"), self.client("ssm"), f"gridfleet-node-{image.dir.name}", parameter,
                       self.ec2_backend())  # fmt: skip
        with self._lock:
            self.images[ami] = image
        log.info("twin-image ami=%s bake_s=%.1f deps=%s", ami, image.bake_s, image.marker.get("deps_sha256"))
        return ami

    def _efs_ids(self) -> tuple[str, ...]:
        """The file systems of the twin's EFS and their access points (`fsap-... fs-...`), what the stand-in
        mount.efs finds."""
        efs = self.client("efs")
        systems = [str(f["FileSystemId"]) for f in efs.describe_file_systems().get("FileSystems", [])]
        points = [
            f"{a['AccessPointId']} {a['FileSystemId']}" for a in efs.describe_access_points().get("AccessPoints", [])
        ]
        return (*systems, *points)

    def _env(self) -> dict[str, str]:
        return {"AWS_DEFAULT_REGION": self.region}

    def _boot(self, spec: InstanceSpec) -> InstanceSandbox:
        box = InstanceSandbox(
            spec.instance_id,
            spec.user_data,
            self.root,
            tags=spec.tags if spec.metadata_tags else None,
            role=(role := self._role_of(spec.instance_profile)),
            role_credentials=self._minter(role, spec.instance_id) if role else None,
            env=self._env(),
            aws_endpoint=self.endpoint,
            stock_users=self.stock_users,
            clock_offset_s=self.clock.instance_offset,
            image=self.images.get(spec.image_id or ""),
            efs_ids=self._efs_ids(),
            security_groups=spec.security_groups,
            firewall=self.firewalls,
            metadata={
                "placement/region": self.region,
                "placement/availability-zone": spec.availability_zone or f"{self.region}a",
                "instance-type": spec.instance_type or "",
            },
        )
        box.start()
        booted = time.time()
        inst = self.ec2_backend().get_instance(spec.instance_id)
        inst.nics[0].private_ip_address = box.address  # where the instance is: the code reads it back from EC2
        if self.ssh_key is not None:
            box.wait_mounted(30)
            start_sshd(box, self.ssh_key[1], user=self.ssh_key[0])
        launched = inst.launch_time.replace(tzinfo=UTC).timestamp()  # moto's: this machine's clock, UTC
        inst.launch_time += timedelta(seconds=self.clock.offset)  # when, on the twin's clock
        offsets = (self.clock.offset, self.clock.instance_offset)
        self.boots.append(Boot(spec.instance_id, spec.role, launched, booted, *offsets, box))
        return box
