"""Mounting a site's own directory for the one crawl that claimed it: the node agent's side of it.

On the embedded default every profile lives under one local directory and nothing is mounted (`NO_MOUNTS`). On
AWS each site's profile and lock live in a directory of that site alone on EFS, reached through the site's own
access point, which root mounts at `<root>/<site>` when a crawl of the site starts and unmounts when it has ended
(`node.site_mounts`): the crawl user's processes see that site's directory and no other's. The agent runs as
that unprivileged user and cannot mount, so it asks root's helper over a unix socket (`SocketMounts`), which
checks who asks (the socket's peer credentials) and that this node holds a claim of the site.

The agent asks for the mount before it takes the site's lock, and for the unmount after it released the lock and
its crawl's processes are gone: an unmount needs every descriptor of the mount closed, and the lock is one.

The protocol: one connection per request, one JSON line each way. A request is ``{"op": "mount", "site": S}``,
``{"op": "unmount", "site": S}`` or ``{"op": "ping"}``; the answer ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any, Protocol

__all__ = ["NO_MOUNTS", "MAX_LINE", "NoMounts", "SiteMountFailed", "SiteMounts", "SocketMounts"]

log = logging.getLogger("gridfleet.node")

#: The longest line either side reads: a request or an answer is a few hundred bytes.
MAX_LINE = 8192


class SiteMountFailed(Exception):
    """The site's directory could not be mounted (refused, or the helper did not answer); args[0] says why."""

    def __init__(self, site: str | None, message: str):
        self.site = site
        super().__init__(message)


class SiteMounts(Protocol):
    """What an attempt asks of the node before its crawl and after it."""

    def mount(self, site: str) -> None:
        """Make the site's own directory visible where its profile store looks; SiteMountFailed if it cannot."""

    def unmount(self, site: str) -> bool:
        """Take it away again (False, logged, when that failed: never raises, as it runs while a crawl closes)."""


class NoMounts:
    """Nothing to mount: the profiles are in one local directory (the embedded default, tests)."""

    def mount(self, site: str) -> None:
        return None

    def unmount(self, site: str) -> bool:
        return True


NO_MOUNTS = NoMounts()


class SocketMounts:
    """The mounts root's helper makes, asked for over its unix socket at `path`."""

    def __init__(self, path: str | Path, timeout_s: float = 90.0):
        self.path = str(path)
        self.timeout_s = timeout_s  # a mount waits for EFS's mount target, which a fresh node may not reach yet

    def ask(self, op: str, site: str | None = None) -> dict[str, Any]:
        """The helper's answer to one request; SiteMountFailed when it refuses or cannot be reached."""
        request = {"op": op} if site is None else {"op": op, "site": site}
        started = time.monotonic()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(self.path)
                try:
                    s.sendall(json.dumps(request).encode() + b"\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a helper that refuses the asker answers before it reads: its answer is still there
                answer = _read_line(s)
        except OSError as e:
            raise SiteMountFailed(site, f"the site-mount helper at {self.path} did not answer: {e}") from None
        try:
            out = json.loads(answer)
        except ValueError:
            raise SiteMountFailed(site, f"the site-mount helper at {self.path} answered no JSON") from None
        if not isinstance(out, dict) or out.get("ok") is not True:
            why = out.get("error") if isinstance(out, dict) else None
            raise SiteMountFailed(site, f"{op} {site or ''}: {why or 'refused'}".replace("  ", " "))
        out["asked_s"] = round(time.monotonic() - started, 3)
        return out

    def mount(self, site: str) -> None:
        self.ask("mount", site)

    def unmount(self, site: str) -> bool:
        try:
            self.ask("unmount", site)
            return True
        except SiteMountFailed as e:
            log.warning("site-unmount-failed site=%s error=%s", site, e)
            return False


def _read_line(s: socket.socket) -> bytes:
    """One line from `s` (without its newline), at most MAX_LINE bytes; what came before the peer closed."""
    data = b""
    while b"\n" not in data and len(data) <= MAX_LINE:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0][:MAX_LINE]
