"""The user local nodes run their Grid node, and so Chromium, as, when the hub runs as root.

A root hub's nodes start their Grid node as the crawl user (`fleet.crawl_user`), so that no browser runs as root;
the agents stay with the invoking user (the project's Python may be where no other user can read it). That needs
the user, and everything the Grid node and Chromium open reachable by it: the kernel is asked, as that user,
whether it may (`test -x`, `test -r`), and when it may not the reason is said and the nodes run as before.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the stack itself is imported only by the commands that run it
    from embedded.stack import LocalStack


@dataclass(frozen=True)
class CrawlUser:
    """The user local nodes start their Grid node as, and the Selenium jar that user can read."""

    name: str
    uid: int
    grid_jar: Path


def user_can(pw: pwd.struct_passwd, test: str, path: Path) -> bool:
    """Whether the user `pw` passes `test <test> <path>` (e.g. -r, -x), run as that user: the kernel's own
    answer, ACLs included (needs root)."""
    groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
    try:
        r = subprocess.run(
            ["test", test, str(path)],
            user=pw.pw_uid,
            group=pw.pw_gid,
            extra_groups=groups,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def umask() -> int:
    """This process's umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return 0o022


def reach_crawl_user(
    name: str, stack: LocalStack, jar: Path, euid: int | None = None
) -> tuple[CrawlUser | None, str | None]:
    """(the user, None) when local nodes can run their Grid node and Chromium as `name`; (None, why not) when
    they cannot; (None, None) when this process is not root (it runs nothing as root)."""
    if (os.geteuid() if euid is None else euid) != 0:
        return None, None
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None, f"there is no user {name} (fleet.crawl_user; `make setup` run as root creates it)"
    if pw.pw_uid == 0:
        return None, f"the crawl user {name} is root"
    if umask() & 0o001:  # the nodes' state dirs are made later, with this umask
        return None, f"the umask {umask():04o} makes the nodes' state dirs closed to user {name}"
    for d in (stack.instances_dir, stack.efs_root / "profiles"):
        d.mkdir(parents=True, exist_ok=True)
        if not user_can(pw, "-x", d):
            return None, f"user {name} cannot reach {d} (GRIDFLEET_HOME must be traversable by it)"
    if not user_can(pw, "-r", jar):  # e.g. a checkout under /root: a copy beside the nodes' state
        copy = stack.dir / "grid" / jar.name
        if not copy.is_file() or copy.stat().st_size != jar.stat().st_size:
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(jar, copy.with_suffix(".part"))
            copy.with_suffix(".part").chmod(0o644)
            os.replace(copy.with_suffix(".part"), copy)
        if not user_can(pw, "-r", copy):
            return None, f"user {name} cannot read {jar} nor its copy {copy}"
        jar = copy
    return CrawlUser(name, pw.pw_uid, jar), None
