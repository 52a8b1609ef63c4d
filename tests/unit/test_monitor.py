"""What the hub shows of a run: /status's view, the Prometheus families and the CloudWatch data, all derived
from the table after a real run of the hub and agents in virtual time; the nodes' own counters; JSON logs."""

from __future__ import annotations

import io
import json
import logging

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from cli.views.run import watch
from fleet.aws.metrics import BATCH, CloudWatchSink, Datum, JobStats
from fleet.logs import JsonFormatter, event, use_json
from hub.monitor import HubMonitor
from node.agent import error_type
from tests.helpers.fleet_sim import RUN, SimCloud, sim_config, viewer_hub

SITES = {"a": "ok", "b": "hang-once", "e": "hang-always", "f": "error-always"}


class RecordingCloudWatch:
    """Stands in for CloudWatch's API where a test counts calls (the round trip is in tests/adapter, on moto)."""

    def __init__(self, fail: bool = False):
        self.calls: list[dict] = []
        self.fail = fail

    def put_metric_data(self, **kw):
        if self.fail:
            raise RuntimeError("throttled")
        self.calls.append(kw)


def run_and_monitor(tmp_path, cw=None):
    cloud = SimCloud(tmp_path, sim_config(SITES), dict(SITES))
    cloud.start_hub()
    cloud.run()
    mon = HubMonitor(RUN, cloud.config, cloud.queue, cloud.clock, CloudWatchSink(cw, "gridfleet", cloud.clock))
    hub = viewer_hub(cloud, tmp_path / "o")
    mon.observe(hub.snapshot(cloud.clock.now()))
    return cloud, mon


def families(mon: HubMonitor) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(generate_latest(mon.registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_prometheus_families_tell_the_run_as_the_table_does(tmp_path):
    cloud, mon = run_and_monitor(tmp_path)
    f = families(mon)
    assert f["gridfleet_sites"][(("status", "COMPLETED"),)] == 2
    assert f["gridfleet_sites"][(("status", "FAILED"),)] == 2
    assert f["gridfleet_run_progress_ratio"][()] == 1.0
    assert f["gridfleet_nodes_active"][()] == 0
    assert set(f["gridfleet_queue_messages"]) == {(("state", s),) for s in ("waiting", "in_flight", "dlq")}
    hangs = sum(1 for r in cloud.table.read_run(RUN).sites for a in r.attempts if a.outcome == "hang")
    assert hangs == 4 and sum(f["gridfleet_kills_total"].values()) == hangs  # every hang was killed, by some path
    assert f["gridfleet_attempts_total"][(("outcome", "error"),)] == 3
    # a and b COMPLETED with 3 items from 3 pages each; the hung and failed attempts fetched no page
    assert f["gridfleet_items_completed"][()] == 6 and f["gridfleet_pages_fetched_total"][()] == 6
    assert f["gridfleet_items_left_out_total"] == {(("why", "collision"),): 0, (("why", "skipped"),): 0}
    # The nodes' own counters, pushed on their node items: one WorkerId label per node.
    completed = f["gridfleet_node_jobs_completed_total"]
    assert sum(completed.values()) == 2 and all(k[0][0] == "worker_id" for k in completed)
    errors = f["gridfleet_node_job_errors_total"]
    by_type: dict[str, float] = {}
    for labels, v in errors.items():
        by_type[dict(labels)["type"]] = by_type.get(dict(labels)["type"], 0) + v
    assert by_type == {"hang": 4, "error": 3}
    assert sum(f["gridfleet_node_job_duration_seconds_count"].values()) == 9  # every attempt timed
    assert len(f["gridfleet_node_heartbeat_timestamp_seconds"]) == len(completed)
    cloud.clock.shutdown()


def test_status_view_has_the_status_json_shape_plus_nodes_kills_and_queue(tmp_path):
    cloud, mon = run_and_monitor(tmp_path)
    st = mon.status()
    assert st["run_id"] == RUN and st["finished"] is True
    assert st["counts"] == {"QUEUED": 0, "RUN": 0, "COMPLETED": 2, "FAILED": 2}
    assert st["sites"]["e"]["run_status"] == "FAILED" and st["sites"]["e"]["attemptCount"] == 3
    assert len(st["kills"]) == 4 and [k["at"] for k in st["kills"]] == sorted(
        (k["at"] for k in st["kills"]), reverse=True
    )
    assert {k["site"] for k in st["kills"]} == {"b", "e"} and all(k["reason"] == "hang" for k in st["kills"])
    assert st["queue"] == {"visible": 0, "in_flight": 0, "dlq": 0}
    assert st["totals"] == {
        "items": 6,
        "pages": 6,
        "pages_fetched": 6,
        "collisions": 0,
        "skipped": 0,
        "robots_skipped": 0,
    }
    assert (st["sites"]["a"]["items"], st["sites"]["a"]["attempts"][-1]["pages"]) == (3, 3)
    json.dumps(st)  # served as is
    cloud.clock.shutdown()


def test_cloudwatch_gets_the_hub_gauges_once_per_interval_and_kills_as_new_since_the_last_publish(tmp_path):
    cw = RecordingCloudWatch()
    cloud, mon = run_and_monitor(tmp_path, cw)
    assert len(cw.calls) == 1 and cw.calls[0]["Namespace"] == "gridfleet"
    data = {d["MetricName"]: d for d in cw.calls[0]["MetricData"] if "Dimensions" not in d}
    assert data["SitesCompleted"]["Value"] == 2 and data["SitesFailed"]["Value"] == 2
    assert data["ActiveNodes"]["Value"] == 0 and data["RunProgress"]["Unit"] == "Percent"
    counted = [data[k]["Value"] for k in ("ItemsCompleted", "PagesFetched", "ItemCollisions", "ItemsSkipped")]
    assert counted == [6, 6, 0, 0]
    assert "Kills" not in data  # the first publish sets the baseline: a restarted hub does not count old kills
    snap, _ = mon.snapshot()
    mon.observe(snap)  # within the interval: nothing sent
    assert len(cw.calls) == 1
    cloud.clock.advance(cloud.config.metrics.interval_s)
    mon.observe(snap)
    kills = [d for d in cw.calls[1]["MetricData"] if d["MetricName"] == "Kills"]
    assert kills and kills[0]["Value"] == 0  # no kill since the last publish
    cloud.clock.shutdown()


def test_the_sink_sends_in_batches_and_a_failing_cloudwatch_costs_only_the_metrics():
    cw = RecordingCloudWatch()
    sink = CloudWatchSink(cw, "ns")
    sink.add([Datum("X", i) for i in range(2 * BATCH + 7)])
    assert sink.flush() == 2 * BATCH + 7 and [len(c["MetricData"]) for c in cw.calls] == [BATCH, BATCH, 7]
    broken = CloudWatchSink(RecordingCloudWatch(fail=True), "ns")
    broken.add(Datum("X", 1))
    assert broken.flush() == 0 and broken.dropped == 1
    off = CloudWatchSink(None, "ns")
    off.add(Datum("X", 1))
    assert off.flush() == 0 and not off.enabled


def test_job_stats_round_trip_and_error_types():
    s = JobStats()
    s.job(2.0)
    s.job(3.5, "hang")
    s.job(1.0, "TimeoutException")
    assert JobStats.from_plain(s.to_plain()) == s
    assert (s.completed, s.timed, s.seconds_sum) == (1, 3, 6.5)
    assert error_type("error", "TimeoutException: page load took 600 s") == "TimeoutException"
    assert error_type("error", "selenium.common.exceptions.WebDriverException: boom") == "WebDriverException"
    assert error_type("error", "HTTP 500 from x") == "error" and error_type("hang", "no progress") == "hang"


def test_logs_are_json_lines_with_the_site_fields_off_a_terminal_and_text_on_one():
    rec_stream = io.StringIO()
    handler = logging.StreamHandler(rec_stream)
    handler.setFormatter(JsonFormatter({"instance_id": "i-default", "run_id": "r0"}))
    log = logging.getLogger("test.json")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    event(log, "kill", run_id="r1", site="zdnet", attempt=2, node="i-0abc", reason="hang", path="ssm")
    log.info("plain %s", "text")
    first, second = (json.loads(line) for line in rec_stream.getvalue().splitlines())
    assert {k: first[k] for k in ("event", "run_id", "site", "attempt", "instance_id", "reason", "path")} == {
        "event": "kill",
        "run_id": "r1",
        "site": "zdnet",
        "attempt": 2,
        "instance_id": "i-0abc",
        "reason": "hang",
        "path": "ssm",
    }
    assert first["level"] == "info" and first["ts"].endswith("+00:00")
    assert second["event"] == "log" and second["msg"] == "plain text" and second["instance_id"] == "i-default"

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert use_json(io.StringIO(), {}) and not use_json(Tty(), {})
    assert use_json(Tty(), {"GRIDFLEET_LOG_FORMAT": "json"})
    assert not use_json(io.StringIO(), {"GRIDFLEET_LOG_FORMAT": "text"})


def test_watch_follows_until_the_run_finishes_and_exits_as_run_does():
    def states(final_failed):
        site = lambda st, n=1: {  # noqa: E731
            "run_status": st,
            "site_status": st if st != "RUN" else "URL_CALL",  # noqa: E731
            "attemptCount": n,
            "failure_reason": None,
            "instance_id": "i-1",
            "lastUpdateEpoch": None,
        }
        yield {
            "run_id": "r",
            "finished": False,
            "sites": {"a": site("RUN"), "b": site("QUEUED")},
            "counts": {"QUEUED": 1, "RUN": 1, "COMPLETED": 0, "FAILED": 0},
        }
        yield {
            "run_id": "r",
            "finished": False,
            "sites": {"a": site("COMPLETED"), "b": site("RUN")},
            "counts": {"QUEUED": 0, "RUN": 1, "COMPLETED": 1, "FAILED": 0},
        }
        end = "FAILED" if final_failed else "COMPLETED"
        yield {
            "run_id": "r",
            "finished": True,
            "sites": {"a": site("COMPLETED"), "b": site(end, 3)},
            "counts": {"QUEUED": 0, "RUN": 0, "COMPLETED": 2 - final_failed, "FAILED": int(final_failed)},
        }

    for failed, code in ((True, 3), (False, 0)):
        it = states(failed)
        out = io.StringIO()
        slept = []
        rc = watch(lambda it=it: next(it), Console(file=out, width=120), interval_s=2, sleep=slept.append)
        lines = out.getvalue().splitlines()
        assert rc == code and slept == [2, 2]
        assert lines[0].startswith("run r: 0/2 sites finished") and lines[-1].startswith("run r: 2/2 sites finished")


def test_watch_on_a_terminal_draws_the_bar_and_the_open_sites_in_place():
    site = {
        "run_status": "RUN",
        "site_status": "URL_CALL",
        "attemptCount": 2,
        "failure_reason": None,
        "instance_id": "i-9",
        "lastUpdateEpoch": None,
    }
    seq = iter(
        [
            {"run_id": "r", "finished": False, "sites": {"slow-site": site}, "counts": {"RUN": 1}},
            {
                "run_id": "r",
                "finished": True,
                "sites": {"slow-site": {**site, "run_status": "COMPLETED", "site_status": "COMPLETED"}},
                "counts": {"COMPLETED": 1},
            },
        ]
    )
    out = io.StringIO()
    rc = watch(lambda: next(seq), Console(file=out, width=120, force_terminal=True), interval_s=1, sleep=lambda s: None)
    text = out.getvalue()
    assert rc == 0 and "run r" in text and "slow-site" in text and "1/1" in text and "\x1b[" in text


def test_a_busy_nodes_last_sign_of_life_is_its_attempts_heartbeat():
    """A busy node writes only its site's heartbeat; its item's heartbeat is from when it claimed."""
    from fleet.record.partition import NodeInfo
    from fleet.record.state import RunStatus, SiteRecord, SiteSpec, SiteStatus
    from hub.monitor import last_beat
    from hub.snapshot import Observations, Snapshot

    rec = SiteRecord(
        run_id=RUN,
        site="s1",
        spec=SiteSpec("http://x.test/"),
        run_status=RunStatus.RUN,
        site_status=SiteStatus.URL_CALL,
        attempt=1,
        instance_id="i-1",
        heartbeat=1000.0,
    )
    busy = NodeInfo(RUN, "i-1", "busy", 100.0, 50.0, site="s1", attempt=1)
    other = NodeInfo(RUN, "i-2", "busy", 100.0, 50.0, site="s1", attempt=1)  # not the site's node
    snap = Snapshot(RUN, None, {"s1": rec}, {"i-1": busy, "i-2": other}, {}, Observations())
    assert last_beat(snap, busy) == 1000.0 and last_beat(snap, other) == 100.0
