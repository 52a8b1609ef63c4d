"""A ``#cloud-config`` user-data document, read into the plan an instance of the twin carries out.

Only the modules gridfleet's templates use are accepted (`write_files`, `runcmd`, `bootcmd`, `packages`,
`package_update`, `package_upgrade`); any other key stops the boot with a `TwinError` naming it, so a
template that starts to rely on more of cloud-init fails here instead of booting differently than on
EC2. The plan is plain JSON: the guest (`twin.instance.guest`) reads it with the standard library only.
`cloud_init_modules()` reads the stages and module order of this machine's (Debian's) /etc/cloud/cloud.cfg,
which the guest follows.
"""

from __future__ import annotations

import base64
import functools
import gzip
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import yaml

_TOP_KEYS = {"write_files", "runcmd", "bootcmd", "packages", "package_update", "package_upgrade"}
_FILE_KEYS = {"path", "content", "encoding", "permissions", "owner", "append", "defer"}
_ENCODINGS = {
    "text/plain": (False, False),
    "b64": (True, False),
    "base64": (True, False),
    "gz": (False, True),
    "gzip": (False, True),
    "gz+b64": (True, True),
    "gzip+base64": (True, True),
    "gz+base64": (True, True),
    "gzip+b64": (True, True),
}
_OWNER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}(:[a-z_][a-z0-9_-]{0,31})?")
_PERM_RE = re.compile(r"0?[0-7]{3,4}")
_PKG_RE = re.compile(r"[a-z0-9][a-z0-9.+-]+")


class TwinError(ValueError):
    """The user-data, or a parameter of the twin, is not something the twin can boot."""


def _file(index: int, item: object) -> dict[str, Any]:
    where = f"write_files[{index}]"
    if not isinstance(item, dict):
        raise TwinError(f"{where}: must be a mapping")
    unknown = sorted(set(item) - _FILE_KEYS)
    if unknown:
        raise TwinError(f"{where}: the twin does not support {', '.join(unknown)}")
    path = item.get("path")
    if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/"):
        raise TwinError(f"{where}.path: {path!r} is not an absolute path")
    content = item.get("content", "")
    if not isinstance(content, (str, bytes)):
        raise TwinError(f"{where}.content: must be text")
    encoding = item.get("encoding", "text/plain")
    if encoding not in _ENCODINGS:
        raise TwinError(f"{where}.encoding: {encoding!r} is not one of {', '.join(sorted(_ENCODINGS))}")
    is_b64, is_gz = _ENCODINGS[encoding]
    data = content.encode() if isinstance(content, str) else content
    try:
        data = base64.b64decode(b"".join(data.split()), validate=True) if is_b64 else data
        data = gzip.decompress(data) if is_gz else data
    except (ValueError, OSError) as e:
        raise TwinError(f"{where}.content: cannot decode as {encoding}: {e}") from None
    perms = item.get("permissions", "0644")
    perms_text = oct(perms)[2:] if isinstance(perms, int) and not isinstance(perms, bool) else perms
    if not isinstance(perms_text, str) or not _PERM_RE.fullmatch(perms_text):
        raise TwinError(f"{where}.permissions: {perms!r} is not an octal mode")
    owner = item.get("owner", "root:root")
    if not isinstance(owner, str) or not _OWNER_RE.fullmatch(owner):
        raise TwinError(f"{where}.owner: {owner!r} is not user[:group]")
    for flag in ("append", "defer"):
        if not isinstance(item.get(flag, False), bool):
            raise TwinError(f"{where}.{flag}: must be true or false")
    return {
        "path": path,
        "data_b64": base64.b64encode(data).decode(),
        "mode": int(perms_text, 8),
        "owner": owner,
        "append": bool(item.get("append", False)),
        "defer": bool(item.get("defer", False)),
    }


def _script(key: str, commands: object) -> str | None:
    """The shell script cloud-init makes of `runcmd`/`bootcmd`: a list is one command with each word quoted,
    a string is a shell line as it is."""
    if commands is None:
        return None
    if not isinstance(commands, list):
        raise TwinError(f"{key}: must be a list")
    lines = ["#!/bin/sh"]
    for i, cmd in enumerate(commands):
        if isinstance(cmd, str):
            lines.append(cmd)
        elif isinstance(cmd, list) and cmd and all(isinstance(w, (str, int)) for w in cmd):
            lines.append(" ".join(shlex.quote(str(w)) for w in cmd))
        else:
            raise TwinError(f"{key}[{i}]: must be a shell line or a non-empty list of words")
    return "\n".join(lines) + "\n"


def _packages(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(p, str) and _PKG_RE.fullmatch(p) for p in value):
        raise TwinError("packages: must be a list of Debian package names (the twin refuses versions)")
    return list(value)


def plan_user_data(user_data: str) -> dict[str, Any]:
    """The plan of a ``#cloud-config`` user-data: files to write (before and after packages), packages that
    must already be installed, and the bootcmd and runcmd scripts."""
    if not user_data.startswith("#cloud-config"):
        raise TwinError("user-data: the twin boots #cloud-config documents only (first line)")
    try:
        doc = yaml.safe_load(user_data)
    except yaml.YAMLError as e:
        raise TwinError(f"user-data: not YAML: {str(e).splitlines()[0]}") from None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise TwinError("user-data: the cloud-config must be a mapping")
    unknown = sorted(str(k) for k in set(doc) - _TOP_KEYS)
    if unknown:
        raise TwinError(f"user-data: the twin does not support {', '.join(unknown)}")
    files = doc.get("write_files") or []
    if not isinstance(files, list):
        raise TwinError("write_files: must be a list")
    return {
        "write_files": [_file(i, f) for i, f in enumerate(files)],
        "packages": _packages(doc.get("packages")),
        "bootcmd": _script("bootcmd", doc.get("bootcmd")),
        "runcmd": _script("runcmd", doc.get("runcmd")),
    }


CLOUD_CFG = Path("/etc/cloud/cloud.cfg")
_STAGES = {"init": "cloud_init_modules", "config": "cloud_config_modules", "final": "cloud_final_modules"}


@functools.lru_cache(maxsize=1)
def cloud_init_modules() -> tuple[dict[str, list[str]], str]:
    """cloud-init's module names by stage, in the order of this machine's cloud.cfg, and cloud-init's version."""
    try:
        cfg = yaml.safe_load(CLOUD_CFG.read_text()) or {}
        version = subprocess.run(["cloud-init", "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, yaml.YAMLError) as e:
        raise TwinError(f"{CLOUD_CFG}: {e} (the twin runs cloud-init's modules in its order: make setup)") from None
    modules = {}
    for stage, key in _STAGES.items():
        names = cfg.get(key)
        if not isinstance(names, list):
            raise TwinError(f"{CLOUD_CFG} has no {key} list")
        modules[stage] = [str(n[0] if isinstance(n, list) else n).replace("-", "_") for n in names]
    return modules, (version.split()[-1] if version.strip() else "unknown")
