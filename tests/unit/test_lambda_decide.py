"""The Lambdas' decisions, from what they read and the watchdog's own clock: no AWS, no clients, time passed in."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from fleet.clock import FakeClock
from fleet.errors import StaleWrite
from fleet.record import ops
from fleet.record.ids import default_run_id
from fleet.record.instance import Instance
from fleet.record.partition import RunInfo
from fleet.record.run_item import RunWatch
from fleet.record.state import Reason, RunState, RunStatus, SiteSpec
from fleet.record.tags import TAG_ROLE, TAG_RUN_ID, TAG_STACK
from lambdas.orphans import FINISHING_HUB_S, Orphan, Orphans
from lambdas.settings import LambdaSettings
from lambdas.starter import Fallback, Launch, Refuse, Skip, StarterView, StartStopped
from lambdas.starter import decide as decide_start
from lambdas.watchdog import (
    End,
    Healthy,
    Observe,
    Restart,
    StaleButAlive,
    Stop,
    Terminate,
    WatchView,
    claim_restart,
    decide,
    decide_run,
    heartbeat_token,
    release_restart,
)
from sim.memory import MemoryStateTable

T0 = 1_800_000_000.0
STACK = "prod"
STALE, GRACE = 600.0, 3600.0
S = LambdaSettings(region="eu-west-1", stack=STACK, hub_launch_template="hub-lt", hub_stale_s=STALE, run_grace_s=GRACE)
REUSABLE = dataclasses.replace(S, hub_instance_id="i-reuse")
ONLY_REUSABLE = dataclasses.replace(REUSABLE, hub_launch_template=None)


def inst(
    iid: str,
    state: str = "running",
    run_id: str | None = "r1",
    role: str | None = "hub",
    stack: str | None = STACK,
    launched_at: float | None = T0 - 3600,
) -> Instance:
    tags = {k: v for k, v in ((TAG_STACK, stack), (TAG_RUN_ID, run_id), (TAG_ROLE, role)) if v is not None}
    return Instance(iid, state, role, tags, launched_at=launched_at)


def run(
    run_id: str = "r1", status: RunState = RunState.RUNNING, hb: float | None = T0, deadline: float = T0 + 3600
) -> RunInfo:
    return RunInfo(run_id, status, T0 - 60, deadline, "20270115", hub_heartbeat=hb)


def watched(r: RunInfo | None = None, seen: str | None = None, since: float | None = None, starts: int = 0) -> RunWatch:
    r = r or run()
    return RunWatch(r, seen, since, None, starts)


# --- the starter -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, hubs, item, configured, expected",
    [
        pytest.param(S, (), None, None, [Launch("r1", "hub-lt", 0)], id="first-hub-of-a-new-run"),
        pytest.param(
            S,
            (inst("i-b", "pending"), inst("i-a"), inst("i-0", "terminated")),
            None,
            None,
            [Refuse("r1", "hub instance i-a of the run is running", "i-a", ("i-a", "i-b"))],
            id="a-hub-is-live",
        ),
        pytest.param(
            S,
            (inst("i-a"),),
            watched(run(status=RunState.FINISHED)),
            None,
            [Refuse("r1", "hub instance i-a of the run is running", "i-a", ("i-a",))],
            id="a-live-hub-refuses-before-the-status-is-looked-at",
        ),
        pytest.param(
            S, (), watched(run(status=RunState.FINISHED)), None, [Skip("r1", "the run is FINISHED")], id="finished"
        ),
        pytest.param(
            S,
            (inst("i-0", "terminated"), inst("i-1", "shutting-down")),
            None,
            None,
            [Launch("r1", "hub-lt", 2)],
            id="later-hub-counts-the-earlier-ones",
        ),
        pytest.param(
            S,
            (inst("i-0", "terminated"),),
            watched(starts=3),
            None,
            [Launch("r1", "hub-lt", 3)],
            id="hub-starts-count-when-ec2-forgot",
        ),
        pytest.param(
            REUSABLE,
            (),
            None,
            inst("i-reuse", "stopped", run_id=None),
            [StartStopped("r1", "i-reuse")],
            id="reusable-hub-started",
        ),
        pytest.param(
            REUSABLE,
            (),
            None,
            inst("i-reuse", "running", run_id="r0"),
            [
                Fallback("r1", "i-reuse", "hub instance i-reuse is running, launching from the template instead"),
                Launch("r1", "hub-lt", 0),
            ],
            id="reusable-hub-busy-falls-back",
        ),
        pytest.param(
            REUSABLE,
            (),
            None,
            None,
            [
                Fallback("r1", "i-reuse", "hub instance i-reuse is missing, launching from the template instead"),
                Launch("r1", "hub-lt", 0),
            ],
            id="reusable-hub-missing-falls-back",
        ),
        pytest.param(
            ONLY_REUSABLE,
            (),
            None,
            inst("i-reuse", "running"),
            [Refuse("r1", "hub instance i-reuse is running", "i-reuse", warn=True)],
            id="no-template-refuses",
        ),
        pytest.param(
            ONLY_REUSABLE,
            (),
            None,
            inst("i-reuse", "stopped", stack="staging"),
            [
                Refuse(
                    "r1",
                    "hub instance i-reuse is stopped but not tagged gridfleet:stack=prod (another "
                    "stack's, or untagged)",
                    "i-reuse",
                    warn=True,
                )
            ],
            id="another-stacks-hub-is-never-started",
        ),
        pytest.param(
            ONLY_REUSABLE,
            (),
            None,
            inst("i-reuse", "stopped", stack=None),
            [
                Refuse(
                    "r1",
                    "hub instance i-reuse is stopped but not tagged gridfleet:stack=prod (another "
                    "stack's, or untagged)",
                    "i-reuse",
                    warn=True,
                )
            ],
            id="an-untagged-hub-is-never-started",
        ),
    ],
)
def test_the_starter_decides(settings, hubs, item, configured, expected):
    assert decide_start(StarterView("r1", hubs, item, configured), settings) == expected


def test_the_default_run_id_is_the_utc_date():
    assert default_run_id(T0 + 3600 * 15) == "2027-01-15"  # 23:00Z
    assert default_run_id(T0 + 3600 * 16) == "2027-01-16"


# --- the watchdog: one run -----------------------------------------------------------------------------


NOW = T0 + 1000
TOKEN = heartbeat_token(run())


@pytest.mark.parametrize(
    "w, instances, expected",
    [
        pytest.param(watched(), (), Observe("r1", TOKEN, None), id="first-look"),
        pytest.param(watched(seen="12.5", since=NOW - 5000), (), Observe("r1", TOKEN, "12.5"), id="heartbeat-moved"),
        pytest.param(watched(seen=TOKEN, since=None), (), Observe("r1", TOKEN, TOKEN), id="observation-lost-its-time"),
        pytest.param(watched(seen=TOKEN, since=NOW - STALE + 1), (), Healthy("r1", STALE - 1), id="not-stale-yet"),
        pytest.param(
            watched(run(hb=1e12), seen="1000000000000.0", since=NOW - 1),
            (),
            Healthy("r1", 1),
            id="the-hubs-clock-is-never-compared-with-ours",
        ),
        pytest.param(
            watched(seen=TOKEN, since=NOW - STALE),
            (inst("i-b", "pending"), inst("i-a")),
            StaleButAlive("r1", STALE, ("i-a", "i-b")),
            id="stale-but-a-hub-is-booting",
        ),
        pytest.param(
            watched(seen=TOKEN, since=NOW - STALE),
            (inst("i-a", run_id="r2"), inst("i-n", role="node"), inst("i-s", "stopped")),
            Restart(watched(seen=TOKEN, since=NOW - STALE), STALE),
            id="stale-and-no-hub-of-the-run",
        ),
        pytest.param(watched(run(deadline=NOW - GRACE - 1), seen=TOKEN, since=NOW - 1), (), End("r1"), id="abandoned"),
        pytest.param(
            watched(run(deadline=NOW - GRACE), seen=TOKEN, since=NOW - 1), (), Healthy("r1", 1), id="within-the-grace"
        ),
    ],
)
def test_the_watchdog_decides_a_run(w, instances, expected):
    assert decide_run(w, instances, NOW, S) == expected


def test_a_missing_heartbeat_is_a_value_too():
    assert heartbeat_token(run(hb=None)) == "-"
    w = watched(run(hb=None), seen="-", since=NOW - STALE)
    assert decide_run(w, (), NOW, S) == Restart(w, STALE)


# --- the watchdog: the whole pass and its orphans ---------------------------------------------------------


def orphan(i: Instance, reason: str) -> Orphan:
    return Orphan(i.id, i.run_id, i.role, reason, i.state)


def test_a_pass_ends_abandoned_runs_and_retires_their_instances_at_once():
    abandoned = watched(run("r-gone", deadline=NOW - GRACE - 1), seen=TOKEN, since=NOW - 1)
    healthy = watched(run("r-ok"), seen=TOKEN, since=NOW - 1)
    gone_hub, gone_node = inst("i-1", run_id="r-gone"), inst("i-2", run_id="r-gone", role="node")
    done_node = inst("i-3", run_id="r-done", role="node")
    fresh = inst("i-4", run_id="r-new", launched_at=NOW - STALE + 1)
    old = inst("i-5", run_id="r-old", launched_at=NOW - STALE)
    kept = (inst("i-6", run_id="r-ok"), inst("i-7", run_id="not a run id"), inst("i-8", run_id=None))
    view = WatchView(
        (abandoned, healthy),
        (gone_hub, gone_node, done_node, fresh, old, *kept),
        {"r-done": watched(run("r-done", status=RunState.FINISHED)), "r-new": None, "r-old": None},
    )

    actions = decide(view, NOW, S)

    assert actions == [
        End("r-gone"),
        Healthy("r-ok", 1),
        Orphans("r-done", "run FINISHED", (orphan(done_node, "run FINISHED"),), ()),
        Orphans("r-gone", "run FINISHED", (orphan(gone_hub, "run FINISHED"), orphan(gone_node, "run FINISHED")), ()),
        Orphans("r-old", "no run item", (orphan(old, "no run item"),), ()),
        Terminate(("i-3", "i-1", "i-2", "i-5")),
    ]


def test_a_hub_that_just_finished_its_run_is_left_to_archive_it_and_end_itself():
    # The race this closes: a pass between the hub's FINISHED mark and its upload of summary.json ended the hub,
    # and the run's summary never reached the bucket.
    hub, node = inst("i-h", run_id="r-done"), inst("i-n", run_id="r-done", role="node")
    just = run("r-done", status=RunState.FINISHED)
    for finished_at, gone in ((NOW - 60, ("i-n",)), (NOW - FINISHING_HUB_S, ("i-n", "i-h")), (None, ("i-n", "i-h"))):
        view = WatchView((), (hub, node), {"r-done": watched(dataclasses.replace(just, finished_at=finished_at))})
        ended = [set(a.instance_ids) for a in decide(view, NOW, S) if isinstance(a, Terminate)]
        assert ended == [set(gone)], finished_at


@pytest.mark.parametrize(
    "instances, others, expected",
    [
        pytest.param(
            (inst("i-s", "stopped"), inst("i-n", "stopping", run_id=None, role="node")),
            {},
            [
                Orphans(
                    "-",
                    "stopped, and kept by no configuration",
                    (
                        orphan(
                            inst("i-n", "stopping", run_id=None, role="node"), "stopped, and kept by no configuration"
                        ),
                    ),
                    (),
                ),
                Orphans(
                    "r1",
                    "stopped, and kept by no configuration",
                    (orphan(inst("i-s", "stopped"), "stopped, and kept by no configuration"),),
                    (),
                ),
                Terminate(("i-n", "i-s")),
            ],
            id="stopped-instances-bill-for-their-volumes",
        ),
        pytest.param(
            (inst("i-reuse", "stopped"), inst("i-nat", "stopped", run_id=None, role=None)),
            {},
            [],
            id="the-reusable-hub-and-the-nat-stay-stopped",
        ),
        pytest.param(
            (inst("i-reuse", run_id="r-done"), inst("i-n", run_id="r-done", role="node")),
            {"r-done": watched(run("r-done", status=RunState.FINISHED))},
            [
                Orphans(
                    "r-done",
                    "run FINISHED",
                    (orphan(inst("i-n", run_id="r-done", role="node"), "run FINISHED"),),
                    (orphan(inst("i-reuse", run_id="r-done"), "run FINISHED"),),
                ),
                Terminate(("i-n",)),
                Stop(("i-reuse",)),
            ],
            id="the-reusable-hub-is-stopped-not-terminated",
        ),
        pytest.param(
            (inst("i-x", run_id="r-late"),),
            {"r-late": watched(run("r-late", deadline=NOW - GRACE - 1))},
            [
                Orphans(
                    "r-late",
                    "run abandoned (RUNNING past deadline + grace)",
                    (orphan(inst("i-x", run_id="r-late"), "run abandoned (RUNNING past deadline + grace)"),),
                    (),
                ),
                Terminate(("i-x",)),
            ],
            id="an-abandoned-run-older-than-the-lookback",
        ),
        pytest.param(
            (inst("i-x", run_id="r-live"),), {"r-live": watched(run("r-live"))}, [], id="a-live-run-keeps-its-own"
        ),
    ],
)
def test_the_watchdog_retires_orphans(instances, others, expected):
    assert decide(WatchView((), instances, others), NOW, REUSABLE) == expected


# --- the watchdog's conditional writes, on the in-memory table -------------------------------------------------


def test_one_claim_of_a_restart_wins_and_a_release_gives_it_back():
    table = MemoryStateTable()
    table.create_run(run())
    table.update_watch("r1", {}, seen_hb=TOKEN, seen_since=NOW - STALE)
    read = table.get_run_watch("r1")
    assert claim_restart(table, read, NOW) is True
    assert claim_restart(table, read, NOW + 1) is False
    assert release_restart(table, read, NOW) is True
    assert table.get_run_watch("r1") == read
    table.update_run("r1", hub_heartbeat=T0 + 5)  # the hub came back after the read
    assert claim_restart(table, read, NOW + 2) is False


# --- how the watchdog ends a run: the kernel's fail_open_sites --------------------------------------------------


class NodeWritesFirst(MemoryStateTable):
    """A table on which a node completes a site just before the first write of another writer lands."""

    site = ""  # armed by the test once the sites are seeded

    def write(self, old, new):
        if self.site and old.site == self.site:
            self.site = ""
            ops.complete(self, old, "result.json", T0)
        return super().write(old, new)


def test_fail_open_sites_fails_what_is_open_and_a_result_written_first_stands():
    table = NodeWritesFirst()
    for name in ("queued", "running", "racing", "done"):
        rec = ops.new_site("r1", name, SiteSpec(f"https://{name}.test/"), None)
        table.create_site(rec)
        if name != "queued":
            rec = ops.claim(table, rec, "i-1", T0 - 10)
        if name == "done":
            ops.complete(table, rec, "done.json", T0 - 5)
    table.site = "racing"

    failed = ops.fail_open_sites(table, "r1", Reason.DEADLINE, FakeClock(T0), error="gone")

    assert sorted(failed) == ["queued", "running"]
    sites = {r.site: r for r in table.read_run("r1").sites}
    assert {n: sites[n].run_status for n in sites} == {
        "queued": RunStatus.FAILED,
        "running": RunStatus.FAILED,
        "racing": RunStatus.COMPLETED,
        "done": RunStatus.COMPLETED,
    }
    assert sites["running"].failure_reason == "deadline" and sites["running"].error == "gone"


def test_fail_open_sites_skips_a_site_that_vanished():
    table = MemoryStateTable()
    rec = ops.new_site("r1", "s", SiteSpec("https://s.test/"), None)
    table.create_site(rec)

    class Vanishing(MemoryStateTable):
        def read_run(self, run_id):
            return table.read_run(run_id)

        def write(self, old, new):
            raise StaleWrite(old.run_id, old.site, old.fence(), None)

    assert ops.fail_open_sites(Vanishing(), "r1", Reason.KILLED, FakeClock(T0), error="x") == ()


def test_the_lambdas_import_nothing_of_the_hub_nor_the_cli():
    code = (
        "import sys; sys.modules.update(dict.fromkeys(['hub', 'cli', 'embedded', 'node'])); "
        "import lambdas.starter, lambdas.watchdog"
    )
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
