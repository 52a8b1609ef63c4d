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
    """`python -m node.child` in its own process group, events on a pipe. Made without a job, it imports what a
    crawl needs and waits for `send(job)`."""

    def __init__(self, job: dict[str, Any] | None, log_path: Path, python: str = sys.executable):
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
        self.log_path = log_path
        self._fd = r
        self._buf = b""
        self._eof = False
        if job is not None:
            self.send(job)

    def send(self, job: dict[str, Any]) -> None:
        """Hand the process its job (once)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode())
        self.proc.stdin.close()

    def waiting(self) -> bool:
        """Whether the process is alive and has no job yet."""
        return self.proc.poll() is None and self.proc.stdin is not None and not self.proc.stdin.closed

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


class SpareCrawlers:
    """Crawler processes started before they are needed, one at a time.

    A spare has started Python and imported Selenium and the built-in crawlers, then waits for its job, so a site's
    crawl does not wait for that (a few tenths of a second, more on a busy machine). The node prepares the next
    spare while a crawl's pages load (`prepare`), when its own processor is mostly idle, and `start` hands the job
    to the spare, or to a new process when there is none. Each process crawls once, as before.
    """

    def __init__(self, log_path: Path, python: str = sys.executable):
        self.log_path = log_path
        self.python = python
        self._spare: ChildProcess | None = None

    def prepare(self) -> None:
        if self._spare is None or not self._spare.waiting():
            self._discard()
            self._spare = ChildProcess(None, self.log_path, self.python)

    def start(self, job: dict[str, Any], log_path: Path) -> ChildProcess:
        spare, self._spare = self._spare, None
        if spare is None or not spare.waiting() or spare.log_path != log_path:
            if spare is not None:
                spare.close()
            return ChildProcess(job, log_path, self.python)
        spare.send(job)
        return spare

    def close(self) -> None:
        """End the spare (the node is leaving)."""
        self._discard()

    def _discard(self) -> None:
        if self._spare is not None:
            self._spare.close()
            self._spare = None
