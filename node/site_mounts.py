"""The node's site-mount helper: root's side of `profiles.mounts`, run as `gridfleet node site-mounts`.

A crawl must see its own site's profile and lock and no other site's. On AWS each site has an EFS access point
rooted at its own directory (`fleet.aws.efs`); this helper mounts, when the agent asks, the access point of the
site it claimed at `<aws.efs_mount>/<site>`, the one place the crawl user's processes look, and unmounts it when
the agent asks after the crawl. `<aws.efs_mount>` itself is root's (0755) and holds the mount points of the sites
mounted now, nothing else; a mount point is made for its mount and removed after it.

Why a root service on a unix socket, and not a sudoers rule: the agent runs with no_new_privs (the boot script
starts it with `setpriv --no-new-privs`, so that no setuid program takes the crawl user back to root), and sudo,
a setuid program, cannot raise its privileges then; a sudoers rule would also need a root command that checks
its arguments, which is this one. The socket is open to every local user, and each request is judged by who
sent it, as the kernel says (SO_PEERCRED): only the crawl user and root may ask.

What a request may do: mount a site only while this node holds a claim of it (its record in the state table,
read with the node role's credentials, is RUN with this instance's id), through the site's own access point
(found by its tags, checked to be rooted at the site's directory with the crawl user as its POSIX user);
unmount any site (taking a directory away is always allowed). An unmount that finds the mount busy (a
process of the crawl still has a descriptor in it) detaches it lazily: the directory leaves the view at once,
the descriptors left keep only what they had open. One request at a time, each read within a few seconds, so a
client that says nothing holds the helper no longer than that.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from fleet.aws.clients import AwsClients
from fleet.aws.efs import SiteAccessPoint, site_points
from fleet.aws.imds import Imds, ImdsError
from fleet.aws.table import DynamoStateTable
from fleet.config.load import load_config
from fleet.errors import ConfigError
from fleet.logs import event, setup
from fleet.record.ids import check_instance_id, is_site_id
from fleet.record.state import RunStatus, SiteRecord
from profiles.mounts import MAX_LINE, SiteMountFailed, SocketMounts

log = logging.getLogger("gridfleet.node")

#: How long a client may take to send its request.
REQUEST_TIMEOUT_S = 5.0
#: One `mount -t efs` (efs-utils starts its TLS tunnel, then NFS mounts through it), and how often it is tried:
#: the mount target of a node's subnet may not answer yet on a fresh node.
MOUNT_TIMEOUT_S = 25.0
MOUNT_TRIES = 3
MOUNT_PAUSE_S = 5.0
UMOUNT_TIMEOUT_S = 30.0

Run = Callable[..., subprocess.CompletedProcess[str]]


class SiteReader(Protocol):
    """What the helper reads of the state table: a site's record (the node role may read any)."""

    def get_site(self, run_id: str, site: str) -> SiteRecord | None: ...


class Refused(Exception):
    """A request this helper will not carry out; args[0] says why (sent back to the client)."""


def mounted(path: Path) -> bool:
    """Whether `path` is a mount point now (by /proc/self/mountinfo: a bind or NFS mount of the same device as its
    parent is one too, which comparing devices would miss)."""
    want = os.path.abspath(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and _unescape(fields[4]) == want:
                return True
    return False


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


class SiteMounter:
    """Mounts and unmounts the sites of one node (as root)."""

    def __init__(
        self,
        *,
        table: SiteReader,
        efs: Any,
        efs_id: str,
        stack: str,
        uid: int,
        run_id: str,
        instance_id: str,
        root: Path,
        run: Run = subprocess.run,
        is_mounted: Callable[[Path], bool] = mounted,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.table, self.efs, self.efs_id, self.stack, self.uid = table, efs, efs_id, stack, uid
        self.run_id, self.instance_id, self.root = run_id, instance_id, root
        self._run, self._mounted, self._monotonic, self._sleep = run, is_mounted, monotonic, sleep
        self._points: dict[str, SiteAccessPoint] = {}  # a site's access point never changes: looked up once

    def mount(self, site: str) -> dict[str, Any]:
        started = self._monotonic()
        self._check_claim(site)
        point = self._point(site)
        target = self.root / site
        if self._mounted(target):  # asked again (an agent that restarted): it is there already
            return {"ok": True, "path": str(target), "access_point": point.id, "mount_s": 0.0}
        target.mkdir(mode=0o755, exist_ok=True)
        argv = ["mount", "-t", "efs", "-o", f"tls,iam,accesspoint={point.id}", f"{self.efs_id}:/", str(target)]
        error = ""
        for attempt in range(1, MOUNT_TRIES + 1):
            error = self._command(argv, MOUNT_TIMEOUT_S)
            if not error and self._mounted(target):
                took = round(self._monotonic() - started, 3)
                event(log, "site-mounted", site=site, access_point=point.id, path=str(target), mount_s=took)
                return {"ok": True, "path": str(target), "access_point": point.id, "mount_s": took}
            event(log, "site-mount-failed", logging.WARNING, site=site, attempt=attempt, error=error or "not mounted")
            if attempt < MOUNT_TRIES:
                self._sleep(MOUNT_PAUSE_S)
        _remove_mount_point(target)
        raise Refused(f"mounting {point.id} ({self.efs_id}) at {target} failed: {error or 'not mounted'}")

    def unmount(self, site: str) -> dict[str, Any]:
        started = self._monotonic()
        target = self.root / site
        lazy = False
        if self._mounted(target):
            error = self._command(["umount", str(target)], UMOUNT_TIMEOUT_S)
            if error and self._mounted(target):  # busy: out of view now, freed when the last descriptor closes
                lazy = True
                error = self._command(["umount", "--lazy", str(target)], UMOUNT_TIMEOUT_S)
                if error and self._mounted(target):
                    raise Refused(f"unmounting {target} failed: {error}")
        _remove_mount_point(target)
        took = round(self._monotonic() - started, 3)
        event(log, "site-unmounted", logging.WARNING if lazy else logging.INFO, site=site, unmount_s=took, lazy=lazy)
        return {"ok": True, "path": str(target), "unmount_s": took, "lazy": lazy}

    def _check_claim(self, site: str) -> None:
        rec = self.table.get_site(self.run_id, site)
        if rec is None or rec.run_status is not RunStatus.RUN or rec.instance_id != self.instance_id:
            held = "no record" if rec is None else f"{rec.run_status} on {rec.instance_id or 'no node'}"
            raise Refused(f"site {site!r} of run {self.run_id} is not claimed by {self.instance_id} ({held})")

    def _point(self, site: str) -> SiteAccessPoint:
        if site not in self._points:  # one listing answers for every site: kept for the sites to come
            self._points = site_points(self.efs, self.efs_id, self.stack, self.uid)[0]
        point = self._points.get(site)
        if point is None:
            raise Refused(f"site {site!r} has no access point of stack {self.stack} on {self.efs_id}")
        return point

    def _command(self, argv: list[str], timeout_s: float) -> str:
        """Run `argv`; "" when it succeeded, else what it said (its last line) or how it ended."""
        try:
            r = self._run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return f"{argv[0]} did not end within {timeout_s:g} s"
        except OSError as e:
            return f"{argv[0]}: {e.strerror or e}"
        if r.returncode == 0:
            return ""
        said = (r.stderr or r.stdout or "").strip().splitlines()
        return f"{' '.join(argv[:2])} exited {r.returncode}: {said[-1] if said else 'no message'}"


def _remove_mount_point(target: Path) -> None:
    """The empty mount point goes with its mount (an `rmdir`: a directory with anything in it stays)."""
    try:
        target.rmdir()
    except OSError:
        pass


# --- the socket --------------------------------------------------------------------------------------------------
def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of `conn`, as the kernel recorded it when it connected."""
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(uid)


def answer(conn: socket.socket, mounter: SiteMounter, allowed: frozenset[int]) -> dict[str, Any]:
    """The answer to the one request on `conn` (read within REQUEST_TIMEOUT_S)."""
    uid = peer_uid(conn)
    if uid not in allowed:
        return {"ok": False, "error": f"uid {uid} may not ask for mounts"}
    conn.settimeout(REQUEST_TIMEOUT_S)
    try:
        data = b""
        while b"\n" not in data and len(data) <= MAX_LINE:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        request = json.loads(data.split(b"\n", 1)[0][:MAX_LINE])
    except (OSError, ValueError):
        return {"ok": False, "error": "no request (one JSON line) within the time allowed"}
    op = request.get("op") if isinstance(request, dict) else None
    site = request.get("site") if isinstance(request, dict) else None
    if op == "ping":
        return {"ok": True}
    if op not in ("mount", "unmount") or not isinstance(site, str) or not is_site_id(site):
        return {"ok": False, "error": "a request is {op: mount|unmount, site: <site id>} or {op: ping}"}
    try:
        return mounter.mount(site) if op == "mount" else mounter.unmount(site)
    except Refused as e:
        event(log, "site-mount-refused", logging.WARNING, op=op, site=site, uid=uid, why=str(e))
        return {"ok": False, "error": str(e)}


def listen(path: Path) -> socket.socket:
    """The unix socket `path`, bound and listening: anyone may connect (`answer` judges who did)."""
    if path.is_socket():
        path.unlink()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(path))
        os.chmod(path, 0o666)
        srv.listen(16)
    except BaseException:
        srv.close()
        raise
    return srv


def serve(srv: socket.socket, mounter: SiteMounter, allowed: frozenset[int]) -> None:
    """Answer requests on the listening socket `srv` (from `listen`), one at a time, until the process is ended."""
    with srv:
        event(log, "site-mounts-ready", socket=str(srv.getsockname()), root=str(mounter.root))
        while True:
            conn, _ = srv.accept()
            with conn:
                try:
                    out = answer(conn, mounter, allowed)
                except Exception as e:  # the outermost frame of one request: the helper answers the next
                    log.exception("site-mount request failed")
                    out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                try:
                    conn.sendall(json.dumps(out).encode() + b"\n")
                except OSError:
                    pass  # the client went away: nothing to tell


# --- the commands --------------------------------------------------------------------------------------------------
def serve_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gridfleet node site-mounts",
        description="As root: mount a site's EFS access point for the crawl of it this node claimed, when the "
        "node agent asks over --socket, and unmount it after.",
    )
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--instance-id", help="this node's id; default: from IMDS")
    ap.add_argument("--socket", type=Path, required=True, help="the unix socket the agent asks on")
    return ap


def serve_main(argv: list[str]) -> int:
    """`gridfleet node site-mounts`: the helper, as root (gridfleet-mounts.service)."""
    args = serve_parser().parse_args(argv)
    if os.geteuid() != 0:
        print("gridfleet node site-mounts: must run as root (it mounts)", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
        aws = config.aws
        iid = args.instance_id or Imds(aws.imds_url).instance_id()
        check_instance_id(iid)
    except (ConfigError, ImdsError, ValueError) as e:
        print(f"gridfleet node site-mounts: {e}", file=sys.stderr)
        return 2
    if not aws.efs_id:
        print("gridfleet node site-mounts: aws.efs_id is not set in the config", file=sys.stderr)
        return 2
    setup(prefix=f"[{iid}] ", defaults={"instance_id": iid, "run_id": args.run_id})
    clients = AwsClients(aws)
    uid = config.fleet.crawl_uid
    mounter = SiteMounter(
        table=DynamoStateTable(clients.client("dynamodb"), aws.table),
        efs=clients.client("efs"),
        efs_id=aws.efs_id,
        stack=aws.stack,
        uid=uid,
        run_id=args.run_id,
        instance_id=iid,
        root=Path(aws.efs_mount),
    )
    serve(listen(args.socket), mounter, frozenset({0, uid}))
    return 0


def ask_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gridfleet node site-mount", description="Ask the site-mount helper.")
    ap.add_argument("op", choices=("ping", "mount", "unmount"))
    ap.add_argument("site", nargs="?")
    ap.add_argument("--socket", type=Path, required=True)
    return ap


def ask_main(argv: list[str]) -> int:
    """`gridfleet node site-mount`: one request to the helper (what the agent asks; also a check by hand)."""
    args = ask_parser().parse_args(argv)
    if (args.op == "ping") != (args.site is None):
        print("gridfleet node site-mount: mount and unmount name a site, ping none", file=sys.stderr)
        return 2
    try:
        out = SocketMounts(args.socket).ask(args.op, args.site)
    except SiteMountFailed as e:
        print(f"gridfleet node site-mount: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0
