"""One instance of the twin: its user-data booted for real on this machine, in namespaces of its own (root).

`InstanceSandbox.start()` gives the instance a network namespace on the twin's bridge (`network`), its
IMDSv2 inside it (`imds`), and runs the guest (`guest`) with ``ip netns exec ... unshare --pid --fork
--mount-proc``: the guest is PID 1 of the instance and mounts its private directories over the paths the boot
scripts use, so those paths work unchanged and nothing the boot writes reaches the host's:

  /etc, /usr/local/sbin   a copy of the host's, made at start (the shims of `shims` in the latter)
  /usr, /var/lib/dpkg     the host's, under an overlay whose upper layer is the instance's own: what dpkg
                          installs (the stand-in packages of `standins`) is the instance's alone
  /var/log, /var/lib/cloud, /root, /tmp, /dev/console   empty per-instance directories (a file for the console)
  install_dir, state_dir   per-instance directories (default /opt/gridfleet, /var/lib/gridfleet)
  /var/lib/cloud/twin/efs  the one directory all instances of the twin share, which `mount -t efs` (the stand-in
                          amazon-efs-utils) binds over the EFS mount point: an instance without it has no EFS

An instance launched from a baked node image (`image`, `twin.instance.images`) starts with the image's
install and state directories, its /usr and dpkg layers under its own, and its accounts in /etc; `layers`
copies other host directories into private ones before the boot (the bake's bundle into /root).

cloud-init's stages and module lists come from this machine's /etc/cloud/cloud.cfg (Debian's cloud-init), so
the guest runs the modules in Debian's order. With `clock_offset_s`, every process of the boot runs with its
wall clock that far ahead of this machine's (`CLOCK_LIB` preloaded; its monotonic clock is this machine's), as
an instance of a twin whose clock jumped.

With `firewall` (`twin.instance.firewall.Firewalls`), the instance's `security_groups` are enforced in its network
namespace from before its boot starts until the namespace is gone; without, nothing filters its traffic.

A mount point missing on the host (e.g. /efs) is created there, empty, as mounts need one. Every process of
the instance is in its PID namespace, so `stop()` ends them all by killing its init, after a SIGTERM to each
when the stop is an instance's shutdown (services flush, as systemd lets them); what entered the network
namespace otherwise is killed by pid. The host side of the boot's output is `boot_log` (the guest and the
scripts' stdout), the script's own logs are under `var_log`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from twin.instance import network
from twin.instance.cloud_config import TwinError, cloud_init_modules, plan_user_data
from twin.instance.debian import NAMES_GUEST_PATH, load_index, write_names
from twin.instance.imds import InstanceImds
from twin.instance.shims import SHIMS, SHUTDOWN_MARKER, aws_shim, shutdown_delay
from twin.instance.standins import AGENT_PID_FILE, EFS_IDS, EFS_SHARE

if TYPE_CHECKING:
    from twin.instance.firewall import Firewalls
    from twin.instance.images import BakedImage

#: The instance clock's preload library (twin/native/clockshift.c, built by `make setup`), and where an
#: instance whose clock runs ahead of this machine's has its copy (readable by every user of the instance).
CLOCK_LIB = Path(__file__).resolve().parents[2] / ".tools" / "twin" / "libclockshift.so"
CLOCK_GUEST_PATH = "/var/lib/cloud/twin/clockshift.so"
#: At a stop with a grace, how long the guest has to say how its boot ended once the boot's processes are gone.
GUEST_WORD_S = 2.0
INSTANCE_ID_RE = re.compile(r"i-[0-9a-f]{8,17}")
GUEST = Path(__file__).with_name("guest.py")
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: (layer name, path): the host's, under an upper layer of the instance's own; what dpkg writes lies in them
_OVERLAID = (("usr", "/usr"), ("dpkg", "/var/lib/dpkg"))
_LAST = (("root-home", "/root"), ("tmp", "/tmp"))  # last: the twin's own paths may lie under them


#: Debian's packages as this machine's lists have them, read once a process (the lists do not change under a twin)
debian_index = functools.lru_cache(maxsize=1)(load_index)


@dataclass(frozen=True)
class Mount:
    """A mount of the instance: `source` bound over `target`, or an overlay of `lower` (host directories, top
    first) under the upper layer `source` (its work directory beside it)."""

    source: str
    target: str
    lower: tuple[str, ...] = ()

    def plan(self) -> dict[str, str]:
        if not self.lower:
            return {"source": self.source, "target": self.target}
        work = f"{self.source}-work"
        return {"kind": "overlay", "lower": ":".join(self.lower), "upper": self.source, "work": work,
                "target": self.target}  # fmt: skip


@dataclass(frozen=True)
class BootResult:
    """How the boot (the runcmd script, after write_files and packages) ended."""

    exit_code: int  # 124: killed at boot_timeout_s
    seconds: float


def cleanup_leftovers() -> list[str]:
    """Remove the namespaces, veths and bridge a crashed earlier run of the twin left; their names."""
    return network.cleanup_leftovers()


class InstanceSandbox:
    """One instance: `start()` boots `user_data`, `wait_boot()` waits for its runcmd, `stop()` ends it."""

    def __init__(
        self,
        instance_id: str,
        user_data: str,
        root: Path,
        *,
        tags: dict[str, str] | None = None,
        role: str | None = None,
        role_credentials: Callable[[], Mapping[str, str]] | None = None,
        env: dict[str, str] | None = None,
        boot_timeout_s: float = 900.0,
        install_dir: str = "/opt/gridfleet",
        state_dir: str = "/var/lib/gridfleet",
        efs_mount: str = "/efs",
        aws_endpoint: str | None = None,
        stock_users: tuple[str, ...] = (),
        clock_offset_s: float = 0.0,
        metadata: dict[str, str] | None = None,
        image: BakedImage | None = None,
        layers: dict[str, Path] | None = None,
        efs_ids: tuple[str, ...] = (),
        security_groups: tuple[str, ...] = (),
        firewall: Firewalls | None = None,
    ) -> None:
        if not isinstance(instance_id, str) or not INSTANCE_ID_RE.fullmatch(instance_id):
            raise TwinError(f"instance id {instance_id!r} is not i-<8 to 17 hex digits>")
        self.instance_id = instance_id
        self.plan = plan_user_data(user_data)
        self.dir = Path(root) / "instances" / instance_id
        self.efs_dir = Path(root) / "efs"
        self.netns = network.NETNS_PREFIX + instance_id
        self.tags = tags
        self.role = role
        self.role_credentials = role_credentials  # the role session's credentials, minted when IMDS is first asked
        self.env = dict(env or {})
        self.boot_timeout_s = boot_timeout_s
        self.places = {"install": install_dir, "state": state_dir, "efs": efs_mount}
        self.aws_endpoint = aws_endpoint
        self.stock_users = stock_users
        self.clock_offset_s = clock_offset_s
        self.metadata = dict(metadata or {})
        self.image = image
        self.layers = dict(layers or {})
        self.efs_ids = efs_ids
        self.security_groups = security_groups
        self.firewall = firewall  # enforces `security_groups` from the moment its network is up, if given
        if clock_offset_s:
            self.env |= {"LD_PRELOAD": CLOCK_GUEST_PATH, "GRIDFLEET_TWIN_CLOCK_OFFSET": f"{clock_offset_s:.3f}"}
        self.address: str | None = None
        self.imds: InstanceImds | None = None
        self._index: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._status_fd: int | None = None
        self._result: BootResult | None = None

    # --- paths on the host ----------------------------------------------------------------------
    @property
    def boot_log(self) -> Path:
        return self.dir / "boot.log"

    @property
    def var_log(self) -> Path:
        return self.dir / "var-log"

    @property
    def console(self) -> Path:
        return self.dir / "console"

    def host_path(self, guest_path: str) -> Path | None:
        """Where a path of the instance lies on the host, when it is in one of its private directories (for an
        overlaid one: in its upper layer, where what the instance wrote is)."""
        for m in reversed(self._mounts()):  # the last mount over a path is the one the instance sees
            if guest_path == m.target or guest_path.startswith(m.target.rstrip("/") + "/"):
                return Path(m.source) / guest_path[len(m.target) :].lstrip("/")
        return None

    @property
    def shutdown_requested(self) -> str | None:
        """What the instance's `shutdown`/`poweroff` said (time, command, arguments), or None."""
        marker = self.host_path(SHUTDOWN_MARKER)
        return marker.read_text() if marker and marker.exists() else None

    def shutdown_delay_s(self) -> float | None:
        """How long after it was asked the instance's shutdown takes (`shims.shutdown_delay`), or None."""
        return shutdown_delay(self.shutdown_requested or "")

    def _mounts(self) -> list[Mount]:
        d = self.dir
        image = self.image.dir if self.image is not None else None
        mounts = [Mount(str(d / "etc"), "/etc")]
        for name, target in _OVERLAID:
            lower = (str(image / name),) if image is not None and (image / name).is_dir() else ()
            mounts.append(Mount(str(d / f"{name}-upper"), target, (*lower, target)))
            if name == "usr":
                mounts.append(Mount(str(d / "usr-local-sbin"), "/usr/local/sbin"))
        mounts += [Mount(str(d / "var-log"), "/var/log"), Mount(str(d / "var-lib-cloud"), "/var/lib/cloud")]
        mounts += [Mount(str(d / "console"), "/dev/console"), Mount(str(self.efs_dir), EFS_SHARE)]
        mounts += [Mount(str(d / "install"), self.places["install"]), Mount(str(d / "state"), self.places["state"])]
        return mounts + [Mount(str(d / name), target) for name, target in _LAST]

    # --- life -----------------------------------------------------------------------------------
    def _prepare(self) -> None:
        if self.dir.exists():
            raise TwinError(f"{self.dir} exists: an instance id boots once")
        self.dir.mkdir(parents=True, mode=0o700)
        subprocess.run(["cp", "-a", "/etc", str(self.dir / "etc")], check=True, timeout=120)
        shutil.copytree("/usr/local/sbin", self.dir / "usr-local-sbin", symlinks=True)
        shims = dict(SHIMS)
        if self.aws_endpoint:
            shims["aws"] = aws_shim(self.aws_endpoint)
        for name, text in shims.items():
            shim = self.dir / "usr-local-sbin" / name
            shim.write_text(text)
            shim.chmod(0o755)
        for user in self.stock_users:  # the host's own users of that name are not on a stock image
            if subprocess.run(["getent", "passwd", user], capture_output=True).returncode == 0:
                subprocess.run(["userdel", "--prefix", str(self.dir), user], check=True, timeout=30)
        for name in ("var-log", "var-lib-cloud", "install", "state", "root-home", "tmp", "usr-upper", "usr-upper-work",
                     "dpkg-upper", "dpkg-upper-work"):  # fmt: skip
            (self.dir / name).mkdir(mode=0o755)
        ids = self.dir / "var-lib-cloud" / EFS_IDS.removeprefix("/var/lib/cloud/")
        ids.parent.mkdir(parents=True)
        ids.write_text("".join(f"{i}\n" for i in self.efs_ids))
        names = self.dir / "var-lib-cloud" / NAMES_GUEST_PATH.removeprefix("/var/lib/cloud/")
        write_names(names, debian_index())  # what the instance's apt-get knows of Debian
        (self.dir / "root-home").chmod(0o700)
        (self.dir / "tmp").chmod(0o1777)
        if self.image is not None:
            self.image.apply(self.dir)
        for name, source in self.layers.items():
            subprocess.run(["cp", "-a", f"{source}/.", str(self.dir / name)], check=True, timeout=300)
        self.console.touch(mode=0o600)
        if self.clock_offset_s:
            if not CLOCK_LIB.is_file():
                raise TwinError(f"{CLOCK_LIB} is missing (`make setup` builds it): the instance's clock cannot move")
            lib = self.host_path(CLOCK_GUEST_PATH)
            assert lib is not None
            lib.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(CLOCK_LIB, lib)
            lib.chmod(0o644)
        self.efs_dir.mkdir(mode=0o700, exist_ok=True)
        self.efs_dir.chmod(0o700)  # the NFS server's tree: root's alone, here and inside every instance (EFS_SHARE)
        for m in self._mounts():
            if Path(m.source).is_dir() and not m.target.startswith("/var/lib/cloud/"):
                Path(m.target).mkdir(parents=True, exist_ok=True)  # a bind mount needs a mount point
        Path(self.places["efs"]).mkdir(parents=True, exist_ok=True)  # where the boot mounts EFS

    def _guest_plan(self) -> Path:
        env = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8", **self.env}
        mounts = [m.plan() for m in self._mounts()]
        modules, version = cloud_init_modules()
        doc = {**self.plan, "env": env, "mounts": mounts, "timeout_s": self.boot_timeout_s, "modules": modules,
               "cloud_init_version": version}  # fmt: skip
        path = self.dir / "plan.json"
        path.write_text(json.dumps(doc))
        return path

    def start(self) -> InstanceSandbox:
        """Prepare the instance's directories and network, start its IMDS, and start the boot."""
        if os.geteuid() != 0:
            raise TwinError("the EC2 twin needs root (network and mount namespaces)")
        self._prepare()
        plan = self._guest_plan()
        self._index = network.free_index()
        try:
            self.address = network.add_instance(self.netns, self._index)
            if self.firewall is not None:  # before anything runs in the instance: EC2 filters from its first packet
                self.firewall.joined(self.instance_id, self.netns, self.address, self.security_groups)
            self.imds = InstanceImds(
                self.netns,
                self.instance_id,
                self.address,
                self.tags,
                self.role,
                meta=self.metadata,
                mint=self.role_credentials,
            )
            self._spawn(plan)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, plan: Path) -> None:
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        read_fd, write_fd = os.pipe()
        cmd = ["ip", "netns", "exec", self.netns, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        cmd += [python, "-I", str(GUEST), str(plan), str(write_fd)]
        with self.boot_log.open("ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,
                env={"PATH": GUEST_PATH, "LANG": "C.UTF-8"},
            )
        os.close(write_fd)
        self._status_fd = read_fd

    def wait_boot(self, timeout_s: float) -> BootResult | None:
        """The boot's result, waiting at most `timeout_s`; None while it runs."""
        if self._result is not None or self._status_fd is None:
            return self._result
        ready, _, _ = select.select([self._status_fd], [], [], timeout_s)
        if not ready:
            return None
        line = os.read(self._status_fd, 4096).decode()
        os.close(self._status_fd)
        self._status_fd = None
        if not line.strip():  # the guest died before it could say
            self._result = BootResult(exit_code=-1, seconds=0.0)
        else:
            status = json.loads(line)
            self._result = BootResult(exit_code=int(status["exit_code"]), seconds=float(status["seconds"]))
        return self._result

    def wait_mounted(self, timeout_s: float) -> None:
        """Return once the guest has bound the instance's own directories (before that, a command entering the
        instance would see the host's); TwinError after `timeout_s`."""
        marker = self.dir / "var-lib-cloud" / "twin" / "mounted"
        deadline = time.monotonic() + timeout_s
        while not marker.exists():
            if time.monotonic() > deadline or (self._proc is not None and self._proc.poll() is not None):
                raise TwinError(f"{self.instance_id}: its directories are not bound after {timeout_s:g} s")
            time.sleep(0.05)  # the guest binds a dozen directories: a few milliseconds

    def init_pid(self) -> int:
        """The host pid of the instance's init (the guest)."""
        if self._proc is None:
            raise TwinError(f"{self.instance_id} is not running")
        children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children").read_text().split()
        if not children:
            raise TwinError(f"{self.instance_id} has no init process")
        return int(children[0])

    def run(self, argv: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside the instance (its network, mounts and processes), as root."""
        env = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8", **self.env}
        cmd = ["nsenter", "--target", str(self.init_pid()), "--mount", "--net", "--pid", "--", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd="/")

    def processes(self) -> list[int]:
        """The pids (on the host) of every process of the instance."""
        return network.pids(self.netns)

    def ssm_agent_online(self) -> bool:
        """Whether the instance runs an SSM agent (the stand-in's, `standins`): what SSM can deliver commands to."""
        try:
            out = self.run(["sh", "-c", f'p=$(cat {AGENT_PID_FILE}) && kill -0 "$p"'], timeout_s=10)
        except (TwinError, OSError, subprocess.SubprocessError):
            return False
        return out.returncode == 0

    def _terminate(self, grace_s: float) -> None:
        """SIGTERM to every process of the instance but its init, and up to `grace_s` for them to end, as an OS
        that shuts down gives its services (the log shipper flushes)."""
        try:
            spare = {self.init_pid(), self._proc.pid if self._proc else -1}
        except (TwinError, OSError):
            return
        deadline = time.monotonic() + grace_s
        for pid in set(self.processes()) - spare:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        while set(self.processes()) - spare and time.monotonic() < deadline:
            time.sleep(0.1)  # what the services do at SIGTERM: a flush, a few hundred milliseconds

    def stop(self, grace_s: float = 0.0) -> None:
        """Kill every process of the instance (after a SIGTERM and up to `grace_s` for them to end), stop its
        IMDS, delete its veth and namespace; idempotent. The boot's result, if the guest gave one, stays readable."""
        if grace_s > 0 and self._proc is not None and self._proc.poll() is None:
            self._terminate(grace_s)
            # the guest outlives the processes its boot started: once they are gone (ended, or killed mid-step)
            # it ends its stages and says how the boot ended; SIGKILL at once would race its word
            self.wait_boot(GUEST_WORD_S)
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # unshare; its child, the init, follows it
            except ProcessLookupError:
                pass
            self._proc.wait(timeout=30)
        if self._status_fd is not None:
            self.wait_boot(0)  # what the guest said before it ended (an instance's own shutdown races the reader)
        if self._status_fd is not None:
            os.close(self._status_fd)
            self._status_fd = None
        if self.imds is not None:
            self.imds.stop()
            self.imds = None
        left = network.kill_all(self.netns)
        try:
            network.remove_instance(self.netns, self._index)
        finally:
            if self.firewall is not None:  # its address is free: no other instance's rules may name it now
                self.firewall.left(self.instance_id)
        if left:
            raise TwinError(f"{self.instance_id}: processes {left} survived SIGKILL")

    def __enter__(self) -> InstanceSandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
