"""`gridfleet ship-logs` and `gridfleet logs` against the moto server: lines shipped once each, read back merged.

The shipper runs in this process with a fake clock whose every sleep (one a poll) runs the test's next step:
append to a file, rotate it, create the missing group, send SIGTERM. So a test follows a file for minutes of the
shipper's time without waiting for any.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.awsrequest import AWSResponse
from rich.console import Console

from cli.commands import logs as logs_cmd
from cli.commands.logs import cmd_ship_logs
from cli.main import build_parser, main
from fleet.aws import clients as fleet_aws
from fleet.aws import cwlogs
from fleet.clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]
RUN = "2026-11-27"
NODE = "i-0123456789abcdef0"
OTHER_NODE = "i-0abcdefabcdefabcd"
SHORT_NODE = "i-1234abcd"
HUB = "i-0fedcba9876543210"


@dataclass
class Stack:
    config: Path
    hub: str  # the stack's log groups
    node: str
    logs: Any  # a logs client on the moto server

    def messages(self, group: str | None = None, stream: str = f"{RUN}/{NODE}") -> list[str]:
        return [m for _, m in self.events(group, stream)]

    def events(self, group: str | None = None, stream: str = f"{RUN}/{NODE}") -> list[tuple[int, str]]:
        try:
            got = self.logs.get_log_events(logGroupName=group or self.node, logStreamName=stream, startFromHead=True)
        except self.logs.exceptions.ResourceNotFoundException:
            return []
        return [(e["timestamp"], e["message"]) for e in got["events"]]

    def put(self, group: str, stream: str, events: list[tuple[float, str]]) -> None:
        self.logs.create_log_stream(logGroupName=group, logStreamName=stream)
        for start in range(0, len(events), 5000):  # PutLogEvents takes 10,000 events a call
            batch = [{"timestamp": int(t * 1000), "message": m} for t, m in events[start : start + 5000]]
            self.logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=batch)


@pytest.fixture
def stack(moto_endpoint, shared_clients, tmp_path, monkeypatch) -> Stack:
    """A stack of its own (its two log groups created, as infra/terraform would) and a fleet.yaml naming it."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    name = f"t{uuid.uuid4().hex[:12]}"
    config = tmp_path / "fleet.yaml"
    aws = {"endpoint_url": moto_endpoint, "region": "ap-northeast-2", "stack": name, "max_retries": 0}
    config.write_text(yaml.safe_dump({"aws": aws, "sites": [{"id": "alpha", "start_url": "https://alpha.test/"}]}))
    logs = shared_clients.client("logs")
    for group in (f"/{name}/hub", f"/{name}/node"):
        logs.create_log_group(logGroupName=group)
    return Stack(config, f"/{name}/hub", f"/{name}/node", logs)


class Polls(FakeClock):
    """The shipper's clock: each sleep (one a poll) lets the time pass and runs the test's next step."""

    def __init__(self, *steps: Callable[[], object]):
        super().__init__(time.time())  # moto takes events of the last 14 days only, by its own clock
        self.steps = list(steps)

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.steps:
            self.steps.pop(0)()

    def done(self) -> bool:
        return not self.steps


class _NoBody:
    def stream(self, **_: Any):
        yield b""


def idle() -> None:
    pass


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def ship(stack: Stack, files: list[Path], state: Path, *extra: str, **kw: Any) -> int:
    argv = ["ship-logs", *map(str, files), "--config", str(stack.config), "--state", str(state), *extra]
    if "--group" not in extra:
        argv += ["--group", stack.node]
    args = build_parser().parse_args([*argv, "--stream", f"{RUN}/{NODE}"])
    return cmd_ship_logs(args, Console(), clock=kw.get("clock") or FakeClock(time.time()), stopping=kw.get("stopping"))


def iso(t: float, ms: bool = False) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds" if ms else "seconds")


def marks(state: Path) -> dict[str, dict[str, int]]:
    return json.loads((state / "offsets.json").read_text())["files"]


# --- ship-logs --once --------------------------------------------------------------------------------------------
def test_once_ships_each_line_at_its_own_time_and_cuts_a_huge_one(stack, tmp_path):
    now = int(time.time()) - 1 + 0.9996  # read times are kept to the nearest ms (watchtower would cut 0.6 off)
    boot, agent, state = tmp_path / "boot.log", tmp_path / "agent.log", tmp_path / "state"
    started = f"{iso(now - 3600).replace('+00:00', 'Z')} boot: starting"  # as the boot script writes its lines
    baked = f"{iso(now - 20 * 86400)} a line of the image's bake, older than CloudWatch takes"
    ahead = f"{iso(now + 5 * 3600)} a clock far ahead"
    boot.write_text(
        f"{started}\n{baked}\n{ahead}\n\na line without a time\n" + "x" * 300_000 + "\nthe last line, without newline"
    )
    claim = json.dumps({"ts": iso(now - 1800, ms=True), "level": "info", "event": "claim", "site": "alpha"})
    agent.write_text(claim + "\n")

    assert ship(stack, [boot, agent], state, "--once", clock=FakeClock(now)) == 0

    def own(text: str) -> int:
        return round(dt.datetime.fromisoformat(text).timestamp() * 1000)

    read_at = round(now * 1000)
    assert {m: ts for ts, m in stack.events() if not m.startswith("xxx")} == {
        started: own(started.split()[0]),
        baked: read_at,
        ahead: read_at,
        "a line without a time": read_at,
        "the last line, without newline": read_at,
        claim: own(iso(now - 1800, ms=True)),
    }
    huge = [m for m in stack.messages() if m.startswith("xxx")]
    assert len(huge) == 1 and huge[0].endswith(
        f"x [line cut: 300000 bytes, the first {logs_cmd.LINE_HEAD_BYTES} shipped]"
    )
    assert len(huge[0].encode()) + cwlogs.EVENT_OVERHEAD_BYTES <= cwlogs.MAX_EVENT_BYTES
    assert {p: m["offset"] for p, m in marks(state).items()} == {
        str(boot): boot.stat().st_size,
        str(agent): agent.stat().st_size,
    }

    assert ship(stack, [boot, agent], state, "--once") == 0  # from the offsets: nothing new, nothing again
    assert len(stack.messages()) == 7


def test_a_file_that_shrank_or_was_replaced_is_read_from_its_start(stack, tmp_path):
    log, state = tmp_path / "crawler.log", tmp_path / "state"
    log.write_text("one\ntwo\nthree\n")
    assert ship(stack, [log], state, "--once") == 0
    log.write_text("four\n")  # truncated in place (copytruncate), then written
    assert ship(stack, [log], state, "--once") == 0
    new = tmp_path / "new.log"
    new.write_text("five\nsix\nseven\neight\n")  # longer than the offset kept: only its inode tells
    os.replace(new, log)
    assert ship(stack, [log], state, "--once") == 0
    assert stack.messages() == ["one", "two", "three", "four", "five", "six", "seven", "eight"]


def test_batches_stay_within_what_one_putlogevents_call_takes(stack, tmp_path):
    now = time.time()
    log = tmp_path / "agent.log"
    lines = [f"line {i}" for i in range(6000)] + [f"{iso(now - 2 * 86400)} two days ago", f"{iso(now)} now"]
    log.write_text("\n".join(lines) + "\n")
    batches: list[list[int]] = []

    def record(service: str, client: Any) -> None:
        def put(params: dict[str, Any], **_: Any) -> None:
            batches.append([e["timestamp"] for e in params["logEvents"]])

        client.meta.events.register("provide-client-params.cloudwatch-logs.PutLogEvents", put)

    stack.logs.create_log_stream(logGroupName=stack.node, logStreamName=f"{RUN}/{NODE}")  # no call fails first
    fleet_aws.CLIENT_HOOKS.append(record)
    try:
        assert ship(stack, [log], tmp_path / "state", "--once", clock=FakeClock(now)) == 0
    finally:
        fleet_aws.CLIENT_HOOKS.remove(record)
    assert [len(b) for b in batches] == [cwlogs.Batch.MAX_EVENTS, 1000, 1, 1]  # 24 hours at most in one call
    assert all(max(b) - min(b) <= cwlogs.MAX_BATCH_SPAN_S * 1000 for b in batches)
    assert len(stack.messages()) == 6002


# --- ship-logs, following ------------------------------------------------------------------------------------------
def test_follows_appends_a_late_file_a_last_line_without_newline_and_a_rotation(stack, tmp_path):
    agent, crawler, state = tmp_path / "agent.log", tmp_path / "crawler.log", tmp_path / "state"
    agent.write_text("a-1\n")
    seen: dict[str, list[str]] = {}

    def rotate() -> None:
        agent.rename(tmp_path / "agent.log.1")
        append(tmp_path / "agent.log.1", " and its end\na-old-tail\n")  # written by the writer before it reopens
        agent.write_text("a-new-1\n")

    clock = Polls(
        lambda: append(agent, "a-2\na-3\n"),
        lambda: append(crawler, "c-1\n"),  # did not exist: waited for
        lambda: append(agent, "a-4 without newline"),
        *[idle] * 5,
        lambda: seen.setdefault("at 9 s", stack.messages()),  # sent within FLUSH_AFTER_S of being read
        *[idle] * 9,
        lambda: seen.setdefault("at 19 s", stack.messages()),  # not grown for 10 s: the last line went at 13 s
        *[idle] * 5,
        rotate,
        lambda: append(agent, "a-new-2\n"),
    )
    assert ship(stack, [agent, crawler], state, clock=clock, stopping=clock.done) == 0

    assert seen["at 9 s"] == ["a-1", "a-2", "a-3", "c-1"]
    assert seen["at 19 s"] == [*seen["at 9 s"], "a-4 without newline"]
    assert stack.messages() == [*seen["at 19 s"], " and its end", "a-old-tail", "a-new-1", "a-new-2"]
    kept = marks(state)
    assert kept[str(agent)] == {"dev": agent.stat().st_dev, "ino": agent.stat().st_ino, "offset": 16}
    assert kept[str(crawler)]["offset"] == 4


def test_a_restarted_shipper_resumes_from_its_offsets_and_stops_cleanly_on_sigterm(stack, tmp_path):
    log, state = tmp_path / "agent.log", tmp_path / "state"
    log.write_text("l-1\n")

    def crash() -> None:
        raise RuntimeError("the shipper is killed")

    clock = Polls(*[idle] * 6, lambda: append(log, "l-2\n"), idle, crash)
    with pytest.raises(RuntimeError):
        ship(stack, [log], state, clock=clock)
    assert marks(state)[str(log)]["offset"] == 4  # l-1 was confirmed; l-2 was read, and never confirmed
    append(log, "l-3, while no shipper ran\n")

    handler = signal.getsignal(signal.SIGTERM)
    clock = Polls(idle, lambda: append(log, "l-4\n"), lambda: os.kill(os.getpid(), signal.SIGTERM), idle, idle)
    assert ship(stack, [log], state, clock=clock) == 0  # SIGTERM: what was read is sent, and exit 0

    assert len(clock.steps) == 2  # it stopped at the signal
    assert signal.getsignal(signal.SIGTERM) == handler
    got = stack.messages()
    assert got[0] == "l-1" and got.count("l-1") == 1  # confirmed before the crash: never sent again
    assert [m for m in got[1:] if m != "l-2"] == ["l-3, while no shipper ran", "l-4"]
    assert 1 <= got.count("l-2") <= 2  # at least once: it may have left before the crash, and is sent again
    assert marks(state)[str(log)]["offset"] == log.stat().st_size


# --- ship-logs, when a connection goes dead ------------------------------------------------------------------------
class DeadFirstConnection:
    """A TCP relay to the moto server whose first connection is taken and never answered, as a connection through a
    NAT that dropped it: requests go out, no byte comes back, and botocore waits its read timeout. Every later
    connection is relayed. (A real server cannot be told to leave one connection unanswered on demand.)"""

    def __init__(self, target: str):
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted += 1
            if self.accepted == 1:
                self.held.append(conn)  # read by nobody, answered never
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):  # the other direction's pump then ends too
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.mark.filterwarnings("ignore::watchtower.WatchtowerWarning")  # the dead batch's thread, at the relay's close
def test_a_batch_on_a_dead_connection_is_sent_again_on_a_new_one_and_every_line_arrives(stack, tmp_path, monkeypatch):
    """Without a new sink, every batch waits behind the first one for botocore's 40 s read timeout, its retries
    and watchtower's five tries: minutes in which an instance that shuts down loses what it wrote last."""
    relay = DeadFirstConnection(yaml.safe_load(stack.config.read_text())["aws"]["endpoint_url"])
    config = yaml.safe_load(stack.config.read_text())
    config["aws"]["endpoint_url"] = relay.url
    stack.config.write_text(yaml.safe_dump(config))
    monkeypatch.setattr(logs_cmd, "FLUSH_WAIT_S", 0.5)  # the real waits of this test: two of these
    log, state = tmp_path / "boot.log", tmp_path / "state"
    log.write_text("step: imds\n")
    clock = Polls(*[idle] * 8, lambda: append(log, "gridfleet run exited with status 0\n"), *[idle] * 8)
    try:
        assert ship(stack, [log], state, clock=clock, stopping=clock.done) == 0
    finally:
        relay.close()
    got = stack.messages()
    assert relay.accepted >= 2  # the dead one, and the new sink's
    assert [m for m in dict.fromkeys(got)] == ["step: imds", "gridfleet run exited with status 0"]
    assert marks(state)[str(log)]["offset"] == log.stat().st_size


# --- ship-logs, when the group is missing or refused ---------------------------------------------------------------
def test_once_to_a_missing_group_says_so_in_one_line_and_exits_1(stack, tmp_path, capsys):
    log, state = tmp_path / "agent.log", tmp_path / "state"
    log.write_text("l-1\n")
    assert ship(stack, [log], state, "--once", "--group", "/no-such-stack/node") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "/no-such-stack/node" in err[0] and "does not exist" in err[0]
    assert "infra/terraform" in err[0] and "aws.ship_logs: false" in err[0]
    assert not (state / "offsets.json").exists()


def test_the_follower_keeps_its_place_while_the_group_is_missing_and_retries_ever_less_often(stack, tmp_path, capsys):
    log, state = tmp_path / "agent.log", tmp_path / "state"
    group = f"/t{uuid.uuid4().hex[:12]}/node"
    log.write_text("l-1\n")
    clock = Polls(*[idle] * 150, lambda: stack.logs.create_log_group(logGroupName=group), *[idle] * 70)
    tries: list[float] = []

    def count(service: str, client: Any) -> None:
        client.meta.events.register(
            "before-call.cloudwatch-logs.PutLogEvents", lambda **_: tries.append(clock.monotonic())
        )

    clock.steps[3:3] = [lambda: append(log, "l-2\n")]
    fleet_aws.CLIENT_HOOKS.append(count)
    try:
        assert ship(stack, [log], state, "--group", group, clock=clock, stopping=clock.done) == 0
    finally:
        fleet_aws.CLIENT_HOOKS.remove(count)

    assert stack.messages(group) == ["l-1", "l-2"]
    rounds = sorted(set(tries))  # the calls of one flush (watchtower tries a batch 5 times) share a time
    gaps = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
    assert len(rounds) >= 4 and gaps == sorted(gaps)  # failed while the group was missing, waiting longer each time
    longest = logs_cmd.RETRY_MAX_S + logs_cmd.FLUSH_AFTER_S + 2 * logs_cmd.POLL_S  # the wait, then a window's flush
    assert gaps[0] >= logs_cmd.RETRY_FIRST_S and max(gaps) <= longest
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert group in err[0] and "does not exist" in err[0] and "at most a minute apart" in err[0]
    assert err[1] == f"gridfleet ship-logs: shipping to {group} works again"


def test_access_denied_is_one_line_naming_what_to_allow(stack, tmp_path, capsys):
    log = tmp_path / "agent.log"
    log.write_text("l-1\n")

    def deny(service: str, client: Any) -> None:
        def refuse(model: Any, **_: Any) -> Any:
            text = (
                f"User: arn:aws:sts::123456789012:assumed-role/node/i-0 is not authorized to perform: logs:{model.name}"
            )
            parsed = {"Error": {"Code": "AccessDeniedException", "Message": text}, "ResponseMetadata": {}}
            return AWSResponse("https://logs.invalid/", 400, {}, _NoBody()), parsed

        client.meta.events.register("before-call.cloudwatch-logs", refuse)

    fleet_aws.CLIENT_HOOKS.append(deny)
    try:
        assert ship(stack, [log], tmp_path / "state", "--once") == 1
    finally:
        fleet_aws.CLIENT_HOOKS.remove(deny)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "access denied to logs:" in err[0] and "allow logs:CreateLogStream and logs:PutLogEvents" in err[0]


def test_what_the_shipper_says_is_never_shipped_even_when_its_stderr_is_a_shipped_file(stack, tmp_path):
    boot, missing, state = tmp_path / "boot.log", tmp_path / "missing.log", tmp_path / "state"
    boot.write_text("b-1\n")
    argv = ["ship-logs", str(missing), str(boot), "--once", "--config", str(stack.config), "--group", stack.node]
    argv += ["--stream", f"{RUN}/{NODE}", "--state", str(state)]
    with boot.open("a") as stderr:  # as a boot script's `exec >>boot.log 2>&1` would leave it
        done = subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=ROOT, stderr=stderr, timeout=120)
    assert done.returncode == 0
    assert stack.messages() == ["b-1"]
    assert "missing.log: does not exist" in (state / "ship-logs.err").read_text()


# --- gridfleet logs ------------------------------------------------------------------------------------------------
@pytest.fixture
def run_logs(stack) -> float:
    """A run's streams: the hub's, two nodes', another run's, and three names that are not <run_id>/<instance id>."""
    t0 = time.time() - 600
    stack.put(stack.hub, f"{RUN}/{HUB}", [(t0, "hub: run starts"), (t0 + 3, '{"event": "seed", "site": "alpha"}')])
    stack.put(
        stack.node,
        f"{RUN}/{NODE}",
        [
            (t0 + 1, "2026-11-27T06:52:07Z boot: starting"),
            (t0 + 2, '{"event": "claim", "site": "alpha", "attempt": 1}'),
            (t0 + 4, "kill site=alpha attempt=1 reason=hang"),
            (t0 + 6, '{"event": "claim", "site": "alphabet"}'),
        ],
    )
    stack.put(stack.node, f"{RUN}/{SHORT_NODE}", [(t0 + 5, "crawl site=alphabet website=alpha page=\x1b[2J3")])
    stack.put(stack.node, f"other-run/{OTHER_NODE}", [(t0 + 1, "not this run")])
    for bad in (f"{RUN}/not-an-instance", f"{RUN}/{NODE}/extra", f"{RUN}/I-0123ABCD"):
        stack.put(stack.node, bad, [(t0 + 1, "a stream of no instance")])
    return t0


def logs(stack: Stack, capsys, *args: str) -> tuple[int, list[str], list[str]]:
    code = main(["logs", "--config", str(stack.config), *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def at(t: float) -> str:
    return iso(t, ms=True).replace("+00:00", "Z")


def test_logs_merges_the_runs_hub_and_node_streams_by_time(stack, run_logs, capsys):
    t0 = run_logs
    code, out, err = logs(stack, capsys, "--run-id", RUN)
    assert code == 0
    assert out == [
        f"{at(t0)} hub {HUB} hub: run starts",
        f"{at(t0 + 1)} node {NODE} 2026-11-27T06:52:07Z boot: starting",
        f'{at(t0 + 2)} node {NODE} {{"event": "claim", "site": "alpha", "attempt": 1}}',
        f'{at(t0 + 3)} hub {HUB} {{"event": "seed", "site": "alpha"}}',
        f"{at(t0 + 4)} node {NODE} kill site=alpha attempt=1 reason=hang",
        f"{at(t0 + 5)} node {SHORT_NODE} crawl site=alphabet website=alpha page=\\x1b[2J3",
        f'{at(t0 + 6)} node {NODE} {{"event": "claim", "site": "alphabet"}}',
    ]
    assert err == ["gridfleet: skipped 3 log streams not named <run_id>/<instance id>"]


def test_logs_of_one_node_and_of_one_site(stack, run_logs, capsys):
    code, out, err = logs(stack, capsys, "--run-id", RUN, "--node", NODE)
    assert code == 0 and [line.split(" ", 3)[1:3] for line in out] == [["node", NODE]] * 4
    assert err == ["gridfleet: skipped 1 log streams not named <run_id>/<instance id>"]  # <run>/<node>/extra

    code, out, _ = logs(stack, capsys, "--run-id", RUN, "--site", "alpha")
    assert code == 0
    assert [line.split(" ", 3)[3] for line in out] == [
        '{"event": "claim", "site": "alpha", "attempt": 1}',
        '{"event": "seed", "site": "alpha"}',
        "kill site=alpha attempt=1 reason=hang",
    ]


def test_logs_reads_every_page_of_streams_and_events(stack, capsys):
    t0 = time.time() - 3600
    nodes = [f"i-{n:017x}" for n in range(52)]  # DescribeLogStreams gives 50 a page
    for n, node in enumerate(nodes):
        stack.put(stack.node, f"{RUN}/{node}", [(t0 + n, f"line of {node}")])
    stack.put(stack.hub, f"{RUN}/{HUB}", [(t0 + 100 + i / 1000, f"hub {i}") for i in range(10_005)])  # 2 pages
    code, out, _ = logs(stack, capsys, "--run-id", RUN)
    assert code == 0
    assert [line.split(" ", 3)[3] for line in out] == [f"line of {n}" for n in nodes] + [
        f"hub {i}" for i in range(10_005)
    ]


def test_logs_found_nothing_says_where_it_looked_and_exits_1(stack, run_logs, capsys):
    code, out, err = logs(stack, capsys, "--run-id", "2026-01-01")
    assert (code, out) == (1, [])
    assert err == [f"gridfleet: no log lines in the streams 2026-01-01/* of {stack.hub} or {stack.node}"]
    code, out, err = logs(stack, capsys, "--run-id", RUN, "--site", "gamma")
    assert (code, out) == (1, [])
    assert err[-1] == f"gridfleet: no log lines about site gamma in the streams {RUN}/* of {stack.hub} or {stack.node}"


def test_logs_of_a_stack_without_groups_says_so(stack, tmp_path, capsys):
    config = yaml.safe_load(stack.config.read_text())
    config["aws"]["stack"] = "never-applied"
    stack.config.write_text(yaml.safe_dump(config))
    code, _, err = logs(stack, capsys, "--run-id", RUN)
    assert code == 1
    assert "/never-applied/hub and /never-applied/node: no such group; apply infra/terraform" in err[-1]
