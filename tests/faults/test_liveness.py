"""A node that is alive is never declared lost: the hub's liveness decision rests on the freshest evidence it read.

Seen in a real run of the embedded default: a node busy on one site for longer than `heartbeat_timeout_s`
(a busy node writes no node item; its attempt's heartbeats say it lives) finished that site and claimed the
next one while a slow hub tick was between its reads: the tick read the node item before the finish (stale:
written when the long crawl began) and the sites after it (the long site COMPLETED, the next not claimed yet).
The node looked idle and silent for 20 s, and the hub terminated it as `node-lost`.

Here the same happens in virtual time, on purpose and every time: a hub tick pauses after reading the node
items until the long site is COMPLETED (`SlowTick`, a seam: in a real hub the reads of one tick are apart by
their own latency), and a node's SQS receive takes a moment (`SlowReceive`), as it does on AWS.
"""

from __future__ import annotations

from typing import Any

from fleet.record.state import RunStatus, SiteStatus
from tests.helpers.fake_node import pages_script
from tests.helpers.fleet_sim import ATTEMPT_SCRIPTS, BEHAVIOURS, RUN, SimCloud, sim_config


class SlowTick:
    """The hub's table, with one tick that pauses between reading the node items and reading the sites."""

    def __init__(self, table: Any, cloud: SimCloud, armed_when, resume_when):
        self._t, self._cloud = table, cloud
        self._armed_when, self._resume_when = armed_when, resume_when
        self.paused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)

    def read_nodes(self, run_id: str):
        nodes = self._t.read_nodes(run_id)
        if not self.paused and self._armed_when():
            self.paused += 1
            while not self._resume_when():
                self._cloud.clock.sleep(0.05)
        return nodes


class SlowReceive:
    """A node's queue whose receive takes a moment, as an SQS call over the network does."""

    def __init__(self, queue: Any, clock: Any, seconds: float):
        self._q, self._clock, self._s = queue, clock, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)

    def receive(self, wait_s: float, visibility_s: float):
        self._clock.sleep(self._s)
        return self._q.receive(wait_s, visibility_s)


def test_a_node_busy_past_the_heartbeat_timeout_that_finishes_and_claims_around_a_tick_is_not_lost(
    tmp_path, monkeypatch
):
    sites = {"long": "long", "next": "ok"}
    # 25 s on one site, heartbeat_timeout_s 20: the node item (written when the crawl began) goes stale.
    monkeypatch.setitem(ATTEMPT_SCRIPTS, "long", lambda: pages_script(5, step=5.0))
    monkeypatch.setitem(BEHAVIOURS, "long", ["long"])
    config = sim_config(sites, heartbeat_timeout_s=20, order="config")
    config = config.model_copy(update={"fleet": config.fleet.model_copy(update={"max_nodes": 1})})
    cloud = SimCloud(tmp_path, config, sites)
    cloud.queue_for_nodes = SlowReceive(cloud.queue, cloud.clock, 0.4)

    def long_site():
        return cloud.site("long")

    def busy_past_timeout() -> bool:
        r = long_site()
        cur = r.current_attempt if r is not None else None
        return cur is not None and cloud.clock.now() - cur.start > 21

    def long_done() -> bool:  # the node's part of it: its result staged (the hub makes it COMPLETED)
        r = long_site()
        return r is not None and (r.run_status is RunStatus.COMPLETED or r.site_status is SiteStatus.SAVED)

    table = SlowTick(cloud.table, cloud, busy_past_timeout, long_done)
    cloud.start_hub(table=table)
    cloud.run()

    assert table.paused == 1, "the slow tick never happened: the scenario did not reproduce the race"
    report = cloud.check()
    assert report.violations == [], report.violations
    assert report.false_losses == 0, report.false_loss_details
    for name in sites:
        r = cloud.site(name)
        assert r.run_status is RunStatus.COMPLETED
        assert [a.outcome for a in r.attempts] == ["completed"], (name, r.attempts)
    terminations = [e for e in cloud.table.read_run(RUN).history if e.kind == "terminate"]
    assert not [e for e in terminations if e.fields.get("why") == "node-lost"], terminations
    assert len({a.instance_id for n in sites for a in cloud.site(n).attempts}) == 1  # one node did both
