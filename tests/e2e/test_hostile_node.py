"""A real run on the embedded default (moto server, Selenium Grid, Chromium) while a node taken over by a web page
writes at random into everything the node role's policy lets it: the run ends as it would have.

The hostile node is a thread of this test signing nothing: moto judges no IAM, so each request it draws
(tests/helpers/scribbles: values of every DynamoDB type, into every attribute the policy names and some it does not,
under every key shape of the partitions it may write and of those it may not) is first judged by the node role's
inline policy as the twin's apply of infra/terraform renders it (tests/helpers/iam_eval: the one seam), and only a
request IAM would allow is sent to the run's own table. Then the run, `status`, `check`, `report`, the run-end
message and a watchdog pass must all work, every honest site COMPLETED.
"""

from __future__ import annotations

import http.server
import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.clock import SystemClock
from fleet.config.load import load_config
from tests.helpers import scribbles

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RUN = "hostile"
HONEST = [f"h{n}" for n in range(4)]
CONFIG = """\
run: {max_attempts: 3, hang_after_s: 20, heartbeat_timeout_s: 30, watch_interval_s: 1, deadline_s: 300}
fleet: {max_nodes: 2, idle_exit_s: 6}
hub: {port: 0}
notify: {webhook_url: "URL"}
sites:
""" + "".join(f'  - {{id: {s}, start_url: "{{demo}}/s/{s}/?pages=4&delay_s=1.5"}}\n' for s in HONEST)


class Hook(http.server.BaseHTTPRequestHandler):
    got: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        Hook.got.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def policy():
    return scribbles.node_policy(ROOT / "infra" / "terraform")


def hostile(gf, policy, plan: list[scribbles.Write], stop: threading.Event, tally: scribbles.Tally) -> None:
    """The taken-over node: waits for the run's table, then sends the drawn writes IAM allows, until the run ends.
    A write drawn for a node item of `NODE` is sent to one of the run's real nodes."""
    statements, table_arn, _ = policy
    path = gf.home / "local" / "runs" / RUN / "fleet.yaml"
    while not path.is_file() and not stop.is_set():
        time.sleep(0.2)
    if stop.is_set():
        return
    aws = load_config(path).aws
    ddb = AwsClients(aws, credentials=LOCAL_CREDENTIALS).client("dynamodb")
    rng = random.Random(7)
    for w in plan * 3:
        if stop.wait(0.02):
            return
        if w.key == "#node#NODE":
            found = ddb.query(
                TableName=aws.table,
                KeyConditionExpression="run_id = :r AND begins_with(Site, :p)",
                ExpressionAttributeValues={":r": {"S": RUN}, ":p": {"S": "#node#"}},
            )["Items"]
            w = scribbles.Write(
                w.partition, found[rng.randrange(len(found))]["Site"]["S"] if found else w.key, w.values
            )
        if not scribbles.allowed(statements, table_arn, w):
            tally.refused_by_iam += 1
            continue
        try:
            (ddb.put_item if w.put else ddb.update_item)(**w.params(aws.table))
        except ClientError as e:  # a value DynamoDB itself refuses (an index key's type, an item over 400 KB)
            if e.response["Error"]["Code"] != "ValidationException":
                raise
            tally.refused_by_dynamodb += 1
            why = e.response["Error"]["Message"][:80]
            tally.why[why] = tally.why.get(why, 0) + 1
            continue
        tally.sent += 1
        tally.kinds.update(scribbles.kind(v) for v in w.values.values())
        tally.keys.add((w.partition, w.key))


def drawn(strategy: st.SearchStrategy, examples: int = 12) -> list:
    """The examples hypothesis draws of `strategy` (lists), end to end: a real run is too long to run once per
    example, so one run takes them all. Hypothesis starts with the simplest example and grows them from there, so
    the later ones carry the variety."""
    out: list = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def grab(value: list) -> None:
        out.extend(value)

    grab()
    return out


def test_a_run_ends_as_it_would_have_while_a_hostile_node_writes_into_all_it_may(gf, policy):
    plan = drawn(st.lists(scribbles.writes(RUN, HONEST, policy[2], ["NODE"]), min_size=40, max_size=40))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    up = gf.run("local", "up", timeout=180)
    assert up.returncode == 0, up.stderr
    cfg = gf.write_config("hostile.yaml", CONFIG.replace("URL", f"http://127.0.0.1:{server.server_port}/hook"))
    hub = gf.start("run", "--local", "--config", str(cfg), "--run-id", RUN, log="hostile.log")
    stop, tally = threading.Event(), scribbles.Tally()
    writer = threading.Thread(target=hostile, args=(gf, policy, plan, stop, tally), daemon=True)
    writer.start()
    try:
        midway = watchdog_pass(gf)  # while the run runs, with what the node wrote already in the table
        code = hub.wait(timeout=300)
    finally:
        stop.set()
        writer.join(timeout=30)
        server.shutdown()
    log = (gf.cwd / "hostile.log").read_text()
    assert code == 0, log[-4000:]  # finished, every site COMPLETED
    assert tally.sent >= 100 and tally.refused_by_iam >= 20, tally  # the fuzz reached the table, and IAM said no
    assert {"S", "N", "B", "BOOL", "NULL", "L", "M"} <= tally.kinds, tally.kinds
    print(f"hostile writes: {tally.sent} sent to {len(tally.keys)} keys, {tally.refused_by_iam} refused by IAM, "
          f"{tally.refused_by_dynamodb} by DynamoDB; types {sorted(tally.kinds)}")  # fmt: skip

    s = gf.summary(RUN)
    assert {name: s["sites"][name]["run_status"] for name in HONEST} == dict.fromkeys(HONEST, "COMPLETED")
    assert set(s["sites"]) == set(HONEST)  # what a node added is no site of the run
    assert s["unreadable"]["values"] + s["unreadable"]["items"] > 0, s["unreadable"]
    assert s["check"]["ok"], s["check"]
    for args in (("status", "--run-id", RUN), ("check", "--run-id", RUN), ("report", "--run-id", RUN)):
        out = gf.run(*args, timeout=120)
        assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-2000:])
    assert Hook.got and json.loads(Hook.got[-1]).get("run_id", RUN) == RUN  # the run-end message went out
    assert midway["ok"], midway
    after = watchdog_pass(gf)
    assert after["ok"] and after["restarted"] == [] and after["ended"] == [], after


def watchdog_pass(gf) -> dict:
    """One pass of the watchdog Lambda's code on the stack's table: what it decided for the runs it saw (its
    handler, called directly: Lambda invoke needs Docker, which this machine has not)."""
    from fleet.aws.table import DynamoStateTable
    from lambdas.settings import LambdaSettings
    from lambdas.watchdog import watch

    path = gf.home / "local" / "runs" / RUN / "fleet.yaml"
    deadline = time.monotonic() + 60
    while not path.is_file():
        assert time.monotonic() < deadline, "the run never saved its config"
        time.sleep(0.2)
    aws = load_config(path).aws
    clients = AwsClients(aws, credentials=LOCAL_CREDENTIALS)
    settings_ = LambdaSettings(
        region=aws.region, table=aws.table, stack=aws.stack, endpoint_url=aws.endpoint_url, hub_instance_id="i-0abc"
    )
    try:
        out = watch(
            settings_, clients.client("ec2"), DynamoStateTable(clients.client("dynamodb"), aws.table), SystemClock()
        )
    except Exception as e:  # noqa: BLE001 - the test reports what broke the pass
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    states = Counter(o.get("state") for o in out.get("observed", []))
    return {"ok": True, "states": dict(states), "restarted": out.get("restarted", []), "ended": out.get("ended", [])}
