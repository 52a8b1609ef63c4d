"""Start a crawler process and read its events without blocking the agent's loop."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Exited:
    code: int  # negative: killed by that signal


class CrawlProcess(Protocol):
    pid: int

    def next_event(self, timeout_s: float) -> dict[str, Any] | Exited | None: ...

    def kill(self) -> None: ...

    def close(self, grace_s: float = 0) -> None:
        """Wait up to `grace_s` for it to exit by itself, then kill it; release what reads its events."""


class ChildProcess:
    """`python -m node.child` in its own process group, events on a pipe."""

    def __init__(self, job: dict[str, Any], log_path: Path, python: str = sys.executable):
        r, w = os.pipe()
        log = open(log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "node.child", "--event-fd", str(w)],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(w,),
                start_new_session=True,
            )
        finally:
            os.close(w)
            log.close()
        self.pid = self.proc.pid
        self._fd = r
        self._buf = b""
        self._eof = False
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode())
        self.proc.stdin.close()

    def next_event(self, timeout_s: float) -> dict[str, Any] | Exited | None:
        if self._fd < 0:
            return Exited(self.proc.wait())
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    return json.loads(line)
                except ValueError:
                    continue
            if self._eof:
                code = self.proc.wait()
                os.close(self._fd)
                self._fd = -1
                return Exited(code)
            ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout_s))
            if not ready:
                return None
            chunk = os.read(self._fd, 65536)
            if not chunk:
                self._eof = True
            self._buf += chunk
            timeout_s = 0

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self, grace_s: float = 0) -> None:
        try:
            self.proc.wait(timeout=grace_s) if grace_s > 0 else None
        except subprocess.TimeoutExpired:
            pass
        self.kill()  # the whole group: anything the crawler started goes too
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
