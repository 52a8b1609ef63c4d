"""What the hub shows of a run while it goes: the live status, Prometheus families and CloudWatch gauges.

The hub hands each tick's snapshot to `HubMonitor.observe`; everything here is
derived from it (and from the queue's depths, read at most every few seconds),
so the figures come from the table and the provider, never from counters the
hub keeps in memory: a hub restarted mid-run serves the same numbers, kills
included. Nodes' own counters arrive on their node items (`fleet.aws.metrics.JobStats`).

Nothing here may stop a run: a failure to read depths or to publish is logged
and the figures go on from the last good values.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from fleet.aws.metrics import CloudWatchSink, Datum, JobStats
from fleet.clock import Clock
from fleet.config import Config
from fleet.outputs.summary import site_entry, totals
from fleet.record.messages import QueueDepth, SiteQueue
from fleet.record.state import RunStatus
from hub.snapshot import Snapshot

log = logging.getLogger("gridfleet.hub")

#: Queue depths are read at most this often (one SQS call per queue).
DEPTH_EVERY_S = 10.0
#: Kills listed on the dashboard.
RECENT_KILLS = 20


def kills_of(snap: Snapshot) -> list[dict[str, Any]]:
    """Every attempt the hub or a node killed, newest first (from the site records' attempt history)."""
    out = []
    for name, r in snap.sites.items():
        for a in r.attempts:
            if a.kill_path:
                out.append(
                    {
                        "at": a.end,
                        "site": name,
                        "attempt": a.n,
                        "instance_id": a.instance_id,
                        "reason": a.outcome,
                        "path": a.kill_path,
                    }
                )
    return sorted(out, key=lambda k: -(k["at"] or 0))


def last_beat(snap: Snapshot, node: Any) -> float:
    """A node's latest sign of life: its item's heartbeat, or (a busy node writes only its attempt's heartbeat)
    the heartbeat on the site record of the attempt it runs."""
    rec = snap.sites.get(node.site) if node.site else None
    if rec is not None and rec.run_status is RunStatus.RUN and rec.instance_id == node.instance_id and rec.heartbeat:
        return max(node.heartbeat, rec.heartbeat)
    return node.heartbeat


def run_totals(snap: Snapshot) -> dict[str, int]:
    """The run's item and page counts (`fleet.outputs.summary.totals`) from the snapshot's records."""
    return totals({name: site_entry(r) for name, r in snap.sites.items()})


def by_path(kills: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in kills:
        out[k["path"]] = out.get(k["path"], 0) + 1
    return out


class HubMonitor:
    def __init__(
        self,
        run_id: str,
        config: Config,
        queue: SiteQueue | None,
        clock: Clock,
        cloudwatch: CloudWatchSink | None = None,
    ):
        self.run_id = run_id
        self.config = config
        self.queue = queue
        self.clock = clock
        self.cloudwatch = cloudwatch or CloudWatchSink(None, config.metrics.namespace)
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._depth: QueueDepth | None = None
        self._depth_at = float("-inf")
        self._published_at = float("-inf")
        self._kills_published: int | None = None  # kills already sent (first publish sets the baseline)
        self._finished = False
        self._observed_at: float | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Families(self))

    # --- fed by the hub loop ---------------------------------------------------------
    def observe(self, snap: Snapshot, finished: bool = False) -> None:
        now = self.clock.now()
        if self.queue is not None and now - self._depth_at >= DEPTH_EVERY_S:
            self._depth_at = now
            try:
                self._depth = self.queue.depth()
            except Exception as e:  # noqa: BLE001 - depths are a report, not a decision
                log.debug("queue-depth-unavailable error=%s", e)
        with self._lock:
            self._snap = snap
            self._observed_at = now
            self._finished = finished or bool(snap.run and snap.run.finished)
        if self.cloudwatch.enabled and (finished or now - self._published_at >= self.config.metrics.interval_s):
            self._published_at = now
            self.cloudwatch.add(self.cloudwatch_data(snap))
            self.cloudwatch.flush()

    # --- views ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The run as /status and the dashboard show it (the `status --json` shape, plus nodes, kills, queue)."""
        with self._lock:
            snap, finished, now = self._snap, self._finished, self._observed_at
        if snap is None or now is None:
            return {
                "run_id": self.run_id,
                "finished": False,
                "updated_at": None,
                "counts": {},
                "sites": {},
                "totals": totals({}),
                "nodes": [],
                "kills": [],
                "queue": None,
            }
        nodes = []  # ages as of the snapshot, so the view changes only when the run does
        for inst in sorted(snap.live_instances, key=lambda i: i.id):
            n = snap.nodes.get(inst.id)
            nodes.append(
                {
                    "instance_id": inst.id,
                    "instance_type": inst.instance_type,
                    "state": n.state if n else "booting",
                    "site": n.site if n else None,
                    "sites_done": n.sites_done if n else 0,
                    "heartbeat_age_s": round(max(0.0, now - last_beat(snap, n)), 1) if n else None,
                }
            )
        d = self._depth
        sites = {name: site_entry(r) for name, r in sorted(snap.sites.items())}
        return {
            "run_id": self.run_id,
            "finished": finished,
            "updated_at": now,
            "counts": snap.counts(),
            "sites": sites,
            "totals": totals(sites),
            "nodes": nodes,
            "kills": kills_of(snap)[:RECENT_KILLS],
            "queue": {"visible": d.visible, "in_flight": d.in_flight, "dlq": d.dlq} if d else None,
        }

    def cloudwatch_data(self, snap: Snapshot) -> list[Datum]:
        """The hub's gauges (no dimensions, as infra/terraform's dashboard and alarms read them)."""
        c = snap.counts()
        total = max(1, len(self.config.sites))
        kills = kills_of(snap)
        data = [
            Datum("ActiveNodes", len(snap.live_instances)),
            Datum("SitesQueued", c[RunStatus.QUEUED.value]),
            Datum("SitesRunning", c[RunStatus.RUN.value]),
            Datum("SitesCompleted", c[RunStatus.COMPLETED.value]),
            Datum("SitesFailed", c[RunStatus.FAILED.value]),
            Datum("RunProgress", 100.0 * (c["COMPLETED"] + c["FAILED"]) / total, "Percent"),
        ]
        t = run_totals(snap)
        data += [
            Datum("ItemsCompleted", t["items"]),
            Datum("PagesFetched", t["pages_fetched"]),
            Datum("ItemCollisions", t["collisions"]),
            Datum("ItemsSkipped", t["skipped"]),
        ]
        if self._depth is not None:
            data += [
                Datum("QueueVisible", self._depth.visible),
                Datum("QueueInFlight", self._depth.in_flight),
                Datum("QueueDlq", self._depth.dlq),
            ]
        # Kills as a count per period: what happened since the last publish (a restarted hub starts afresh).
        if self._kills_published is not None:
            new = kills[: max(0, len(kills) - self._kills_published)]
            data.append(Datum("Kills", len(new)))
            data += [Datum("Kills", n, "Count", (("KillPath", p),)) for p, n in sorted(by_path(new).items())]
        self._kills_published = len(kills)
        return data

    def snapshot(self) -> tuple[Snapshot | None, QueueDepth | None]:
        with self._lock:
            return self._snap, self._depth


class _Families(Collector):
    """Prometheus families, computed at scrape time from the monitor's latest snapshot."""

    def __init__(self, monitor: HubMonitor):
        self.m = monitor

    def collect(self) -> Iterator[Any]:
        snap, depth = self.m.snapshot()
        run = self.m.run_id
        info = GaugeMetricFamily("gridfleet_run_info", "The run this hub drives", labels=["run_id"])
        info.add_metric([run], 1)
        yield info
        if snap is None:
            return
        c = snap.counts()
        sites = GaugeMetricFamily("gridfleet_sites", "Sites of the run by run_status", labels=["status"])
        for status, n in c.items():
            sites.add_metric([status], n)
        yield sites
        total = max(1, len(self.m.config.sites))
        yield GaugeMetricFamily(
            "gridfleet_run_progress_ratio",
            "Sites finished (COMPLETED or FAILED) / all sites",
            value=(c["COMPLETED"] + c["FAILED"]) / total,
        )
        yield GaugeMetricFamily(
            "gridfleet_nodes_active", "Nodes of the run that are pending or running", value=len(snap.live_instances)
        )
        yield from self._item_families(snap)
        if depth is not None:
            q = GaugeMetricFamily(
                "gridfleet_queue_messages", "Site messages: waiting, in flight, dead-lettered", labels=["state"]
            )
            q.add_metric(["waiting"], depth.visible)
            q.add_metric(["in_flight"], depth.in_flight)
            q.add_metric(["dlq"], depth.dlq)
            yield q
        kills = CounterMetricFamily("gridfleet_kills", "Attempts killed, by the path that worked", labels=["path"])
        outcomes: dict[str, int] = {}
        durations: list[float] = []
        for r in snap.sites.values():
            for a in r.attempts:
                if a.outcome:
                    outcomes[a.outcome] = outcomes.get(a.outcome, 0) + 1
                    if a.end is not None:
                        durations.append(a.end - a.start)
        for path, n in sorted(by_path(kills_of(snap)).items()):
            kills.add_metric([path], n)
        yield kills
        att = CounterMetricFamily("gridfleet_attempts", "Attempts that ended, by outcome", labels=["outcome"])
        for outcome, n in sorted(outcomes.items()):
            att.add_metric([outcome], n)
        yield att
        if durations:
            yield GaugeMetricFamily(
                "gridfleet_attempt_duration_median_seconds",
                "Median duration of ended attempts",
                value=statistics.median(durations),
            )
        yield from self._node_families(snap)

    def _item_families(self, snap: Snapshot) -> Iterator[Any]:
        t = run_totals(snap)
        yield GaugeMetricFamily(
            "gridfleet_items_completed", "Items in the results of the COMPLETED sites", value=t["items"]
        )
        yield CounterMetricFamily(
            "gridfleet_pages_fetched", "Pages the run's attempts fetched, retries included", value=t["pages_fetched"]
        )
        left = CounterMetricFamily(
            "gridfleet_items_left_out",
            "Items the run's attempts did not emit: another of the same id and other content came first "
            "(collision), or it had no id (skipped)",
            labels=["why"],
        )
        left.add_metric(["collision"], t["collisions"])
        left.add_metric(["skipped"], t["skipped"])
        yield left

    def _node_families(self, snap: Snapshot) -> Iterator[Any]:
        done = CounterMetricFamily(
            "gridfleet_node_jobs_completed", "Jobs a node finished with a result", labels=["worker_id"]
        )
        errors = CounterMetricFamily(
            "gridfleet_node_job_errors", "Jobs a node ended without a result, by type", labels=["worker_id", "type"]
        )
        dur = SummaryMetricFamily(
            "gridfleet_node_job_duration_seconds", "Seconds from claim to the job's end", labels=["worker_id"]
        )
        beat = GaugeMetricFamily(
            "gridfleet_node_heartbeat_timestamp_seconds", "A node's last heartbeat (epoch)", labels=["worker_id"]
        )
        for iid, n in sorted(snap.nodes.items()):
            s = JobStats.from_plain(n.stats)
            done.add_metric([iid], s.completed)
            for kind, k in sorted(s.errors.items()):
                errors.add_metric([iid, kind], k)
            dur.add_metric([iid], count_value=s.timed, sum_value=s.seconds_sum)
            beat.add_metric([iid], last_beat(snap, n))
        yield from (done, errors, dur, beat)
