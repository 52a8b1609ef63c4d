"""Helpers for e2e tests: the real CLI in subprocesses, a private GRIDFLEET_HOME, leftover checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from embedded.stack import stack_id_for
from fleet import procs

ROOT = Path(__file__).resolve().parents[2]


def _missing_prerequisites() -> str | None:
    for tool in ("java", "chromium", "chromedriver"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make setup)"
    if not list((ROOT / "vendor").glob("selenium-server-*.jar")):
        return "the Selenium server jar is missing (make setup)"
    return None


@pytest.fixture(autouse=True)
def _prerequisites():
    why = _missing_prerequisites()
    if why:
        pytest.fail(why)  # e2e tests are part of `make test`: a missing browser is a set-up error, not a skip


class Gridfleet:
    def __init__(self, home: Path, cwd: Path):
        self.home = home
        self.cwd = cwd
        self.env = {**os.environ, "GRIDFLEET_HOME": str(home), "PYTHONUNBUFFERED": "1"}

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cli.main", *args]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                self.cmd(*args), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            (self.cwd / "timed-out.log").write_text(err)
            shutil.copytree(
                self.home / "local",
                self.cwd / "timed-out-home",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("grid-home", "*.jar"),
                ignore_dangling_symlinks=True,
            )
            raise AssertionError(
                f"gridfleet {' '.join(args)} still running after {timeout}s; its log ends:\n" + err[-6000:]
            ) from None

    def start(self, *args: str, log: str = "hub.log") -> subprocess.Popen:
        out = open(self.cwd / log, "w")
        return subprocess.Popen(self.cmd(*args), cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def write_config(self, name: str, text: str) -> Path:
        path = self.cwd / name
        path.write_text(textwrap.dedent(text))
        return path

    def status(self, run_id: str) -> dict:
        p = self.run("status", "--run-id", run_id, "--json", timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def summary(self, run_id: str) -> dict:
        return json.loads((self.cwd / "runs" / run_id / "summary.json").read_text())

    def result(self, run_id: str, site: str) -> dict:
        return json.loads((self.cwd / "runs" / run_id / "results" / f"{site}.json").read_text())

    @property
    def stack_file(self) -> Path:
        return self.home / "local" / "stack.json"

    def demo_url(self) -> str:
        return json.loads(self.stack_file.read_text())["components"]["demo"]["url"]

    def demo_stats(self) -> dict:
        with urllib.request.urlopen(self.demo_url() + "/_stats", timeout=5) as r:
            return json.loads(r.read())["sites"]

    def leftovers(self) -> list[str]:
        """Live processes of this home's stack, or using its profiles (Chromium helpers lose the markers)."""
        sid = stack_id_for(self.home / "local")
        out = []
        for p in procs.scan(with_cmdline=True):
            if not p.alive or p.pid == os.getpid():
                continue
            if p.markers.get("GRIDFLEET_STACK") == sid or any(str(self.home) in a for a in p.cmdline):
                out.append(f"{p.pid} {' '.join(p.cmdline)[:120]}")
        return out

    def wait_no_leftovers(self, timeout: float = 15) -> list[str]:
        end = time.monotonic() + timeout
        while True:
            left = self.leftovers()
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.2)


@pytest.fixture
def gf(tmp_path, open_dir):
    g = Gridfleet(open_dir / "home", tmp_path)  # GRIDFLEET_HOME where the crawl user can reach it
    yield g
    if g.stack_file.exists() or g.leftovers():
        g.run("local", "down", timeout=60)
    procs.kill_tree(lambda ps: [p for p in ps if p.markers.get("GRIDFLEET_STACK") == stack_id_for(g.home / "local")])


def attempts(summary: dict, site: str) -> list[dict]:
    return summary["sites"][site]["attempts"]


def assert_no_overlap(summary: dict) -> None:
    """No two attempts of one site ran at the same time."""
    for name, s in summary["sites"].items():
        spans = sorted((a["start"], a["end"]) for a in s["attempts"])
        for (_s1, e1), (s2, _) in zip(spans, spans[1:], strict=False):
            assert e1 is not None and e1 <= s2, f"{name}: attempts overlap: {spans}"
