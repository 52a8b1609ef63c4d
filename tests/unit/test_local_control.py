"""LocalNodeControl on real processes: a crawl is killed by signalling the crawler's process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from fleet import procs
from hub.control.base import KillResult
from hub.control.local import LocalNodeControl
from tests.helpers.wait import wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
# crawler -> child -> grandchild, all in the crawler's process group
CRAWLER = ["sh", "-c", 'sh -c "sleep 60 & wait" & wait']


class Crawler:
    def __init__(self, popen: subprocess.Popen, tree: set[int]):
        self.popen = popen
        self.pid = popen.pid
        self.pgid = os.getpgid(popen.pid)
        self.ticks = procs.start_ticks(popen.pid)
        self.tree = [(pid, procs.start_ticks(pid)) for pid in tree]

    def alive(self) -> list[bool]:
        return [procs.pid_alive(pid, ticks) for pid, ticks in self.tree]


class Rig:
    """One instance of a stack of our own: `<instances>/<run>/<instance>/` with an agent and a crawler."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "instances"
        self.stack = "test-stack-" + uuid.uuid4().hex
        self.run = "run-" + uuid.uuid4().hex[:12]
        self.instance = "i-local-" + uuid.uuid4().hex[:8]
        self.instance_dir.mkdir(parents=True)
        self.popens: list[subprocess.Popen] = []

    @property
    def instance_dir(self):
        return self.dir / self.run / self.instance

    def control(self, run_id: str | None = None) -> LocalNodeControl:
        return LocalNodeControl(self.dir, self.stack, run_id or self.run, wait_s=3.0)

    def start_agent(self, instance_id: str | None = None, stack: str | None = None) -> subprocess.Popen:
        markers = {
            "GRIDFLEET_STACK": stack or self.stack,
            "GRIDFLEET_RUN": self.run,
            "GRIDFLEET_INSTANCE": instance_id or self.instance,
            "GRIDFLEET_ROLE": "node",
        }
        p = procs.spawn(SLEEPER, markers=markers, log_path=self.instance_dir / "node.log")
        self.popens.append(p)
        wait_for(
            lambda: procs.find(
                procs.scan(),
                GRIDFLEET_INSTANCE=markers["GRIDFLEET_INSTANCE"],
                GRIDFLEET_STACK=markers["GRIDFLEET_STACK"],
            )
        )
        return p

    def start_crawler(self) -> Crawler:
        # marked with our run only (for the clean-up), so it never counts as the instance being alive
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDFLEET_")}
        env.update(GRIDFLEET_RUN=self.run, GRIDFLEET_ROLE="crawler")
        p = subprocess.Popen(
            CRAWLER,
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.popens.append(p)
        tree = wait_for(lambda: len(t := procs.descendants(procs.scan(), [p.pid])) == 3 and t)
        return Crawler(p, tree)

    def write_crawler(self, site: str, attempt, pid: int, pgid: int, start_ticks: int | None):
        (self.instance_dir / "crawler.json").write_text(
            json.dumps({"site": site, "attempt": attempt, "pid": pid, "pgid": pgid, "start_ticks": start_ticks})
        )

    def close(self):
        procs.kill_tree(lambda ps: [p for p in ps if p.markers.get("GRIDFLEET_RUN") == self.run], grace_s=0.5)
        for p in self.popens:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=5)


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    yield r
    r.close()


# --- the crawl of the named site and attempt is killed ------------------------------------------


def test_kill_signals_the_crawlers_process_group(rig):
    agent = rig.start_agent()
    crawler = rig.start_crawler()
    rig.write_crawler("example.com", 2, crawler.pid, crawler.pgid, crawler.ticks)

    result = rig.control().kill(rig.instance, "example.com", 2)

    assert result == KillResult(True, "local", f"killed process group {crawler.pgid}")
    assert not procs.pid_alive(crawler.pid, crawler.ticks)  # kill() waits for the crawler itself
    # the rest of the group got the same SIGKILL; they may take a moment longer to go
    wait_for(lambda: crawler.alive() == [False, False, False], timeout=2.0)
    assert crawler.popen.wait(timeout=5) == -signal.SIGKILL
    assert procs.pid_alive(agent.pid)  # the agent itself is left alone


def test_kill_accepts_the_attempt_written_as_a_string(rig):
    rig.start_agent()
    crawler = rig.start_crawler()
    rig.write_crawler("example.com", "3", crawler.pid, crawler.pgid, crawler.ticks)

    result = rig.control().kill(rig.instance, "example.com", 3)

    assert result.ok
    wait_for(lambda: not any(crawler.alive()), timeout=2.0)


# --- another crawl runs: nothing is killed ------------------------------------------------------


@pytest.mark.parametrize(
    "site, attempt",
    [("other.example", 2), ("example.com", 1), ("other.example", 7)],
    ids=["other-site", "other-attempt", "both-differ"],
)
def test_kill_of_another_site_or_attempt_kills_nothing(rig, site, attempt):
    rig.start_agent()
    crawler = rig.start_crawler()
    rig.write_crawler("example.com", 2, crawler.pid, crawler.pgid, crawler.ticks)

    result = rig.control().kill(rig.instance, site, attempt)

    assert result.ok
    assert result.path == "local"
    assert "example.com" in result.detail and "2" in result.detail
    assert crawler.alive() == [True, True, True]


def test_a_crawler_file_without_an_attempt_matches_no_attempt(rig):
    rig.start_agent()
    crawler = rig.start_crawler()
    (rig.instance_dir / "crawler.json").write_text(
        json.dumps({"site": "example.com", "pid": crawler.pid, "pgid": crawler.pgid, "start_ticks": crawler.ticks})
    )

    result = rig.control().kill(rig.instance, "example.com", 0)

    assert result.ok
    assert crawler.alive() == [True, True, True]


# --- no crawler, or it is gone ------------------------------------------------------------------


def test_kill_without_a_crawler_file(rig):
    rig.start_agent()
    assert rig.control().kill(rig.instance, "example.com", 1) == KillResult(True, "local", "no crawler running")


def test_a_crawler_file_that_cannot_be_read_means_no_crawler(rig):
    rig.start_agent()
    (rig.instance_dir / "crawler.json").write_text('{"site": "example.com", "att')
    assert rig.control().kill(rig.instance, "example.com", 1) == KillResult(True, "local", "no crawler running")


def test_the_crawler_file_of_another_run_is_not_used(rig):
    rig.start_agent()
    crawler = rig.start_crawler()
    rig.write_crawler("example.com", 1, crawler.pid, crawler.pgid, crawler.ticks)

    result = rig.control(run_id="run-" + uuid.uuid4().hex[:12]).kill(rig.instance, "example.com", 1)

    assert result == KillResult(True, "local", "no crawler running")
    assert crawler.alive() == [True, True, True]


def test_a_crawler_that_already_exited(rig):
    rig.start_agent()
    p = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    rig.popens.append(p)
    ticks = wait_for(lambda: procs.start_ticks(p.pid))
    p.wait(timeout=10)
    rig.write_crawler("example.com", 1, p.pid, p.pid, ticks)

    assert rig.control().kill(rig.instance, "example.com", 1) == KillResult(True, "local", "crawler already exited")


def test_a_reused_pid_is_not_killed(rig):
    rig.start_agent()
    crawler = rig.start_crawler()
    # same pid, but started at another time: not the crawler the file was written for
    rig.write_crawler("example.com", 1, crawler.pid, crawler.pgid, crawler.ticks - 1)

    result = rig.control().kill(rig.instance, "example.com", 1)

    assert result == KillResult(True, "local", "crawler already exited")
    assert crawler.alive() == [True, True, True]


# --- the instance itself is not running ---------------------------------------------------------


def test_kill_on_an_instance_without_a_process_fails(rig):
    result = rig.control().kill(rig.instance, "example.com", 1)
    assert result.ok is False
    assert result.path == "local"
    assert result.detail == "instance is not running"


def test_a_process_of_another_stack_or_instance_does_not_count(rig):
    rig.start_agent(stack=rig.stack + "-other")
    rig.start_agent(instance_id=rig.instance + "-other")
    assert rig.control().kill(rig.instance, "example.com", 1).ok is False


def test_an_agent_that_died_does_not_count(rig):
    agent = rig.start_agent()
    ticks = procs.start_ticks(agent.pid)
    agent.kill()  # not reaped: it stays in the process table as a zombie
    wait_for(lambda: not procs.pid_alive(agent.pid, ticks))
    assert rig.control().kill(rig.instance, "example.com", 1).ok is False


def test_the_node_kill_command_kills_only_the_named_crawl(rig, tmp_path):
    import subprocess

    crawler = rig.start_crawler()
    state = tmp_path / "state"
    state.mkdir()
    from fleet.crawl import crawlerfile

    crawlerfile.write(state, "example.com", 2, crawler.pid)
    cmd = [sys.executable, "-m", "node", "kill", "--state-dir", str(state), "--site", "example.com"]
    other = subprocess.run(cmd + ["--attempt", "3"], capture_output=True, text=True)
    assert other.returncode == 0 and "crawler runs example.com attempt 2" in other.stdout
    assert procs.pid_alive(crawler.pid)
    done = subprocess.run(cmd + ["--attempt", "2"], capture_output=True, text=True)
    assert done.returncode == 0 and "killed process group" in done.stdout
    wait_for(lambda: not procs.pid_alive(crawler.pid))
