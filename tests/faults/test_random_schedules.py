"""Random schedules of faults, at the fake-cloud level: for every one, the invariants hold.

Hypothesis draws the sites (their behaviour per attempt), the fleet size, whether nodes kill their own
hangs, and a schedule of faults: the hub SIGKILLed at any of its writes or between ticks (a supervisor
starts a new one, as the external watchdog does), nodes killed, spot notices and spot reclaims,
duplicate deliveries switched on, nodes cut off for a while. Each example is a whole run of the real
hub and agents in virtual time (tests/helpers/fleet_sim.py). Derandomized, so CI sees the same examples.
The same schedules run twice: with every first message sent at seeding, and on a metered queue (the hub
knows a previous run's durations and holds sites back until nodes need them).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.record.state import RunStatus
from tests.helpers.fleet_sim import BEHAVIOURS, RUN, SimCloud, sim_config

FAULTS = ("crash_hub", "kill_node", "spot_notice", "reclaim_spot", "duplicates", "partition")

fault = st.tuples(
    st.sampled_from(FAULTS),
    st.floats(min_value=0, max_value=600),
    st.integers(0, 10),
    st.floats(min_value=5, max_value=150),
)
schedule = st.fixed_dictionaries(
    {
        "sites": st.lists(st.sampled_from(sorted(BEHAVIOURS)), min_size=1, max_size=6),
        "max_nodes": st.integers(1, 3),
        "node_watchdog": st.booleans(),
        "first_hub_crash_at_write": st.one_of(st.none(), st.integers(1, 70)),
        "faults": st.lists(fault, max_size=6),
    }
)

#: Whatever befalls it, a site can only end COMPLETED if some attempt of its behaviour can succeed.
CAN_COMPLETE = {name for name, kinds in BEHAVIOURS.items() if {"ok", "slow"} & set(kinds)}
FAILURE_REASONS = {"hang-always": {"hang"}, "error-always": {"error"}}
DISTURBED = {"lost", "deadline", "no-nodes", "busy", "spot"}


def play(tmp: Path, s: dict, metered: bool = False) -> SimCloud:
    sites = {f"s{i}": b for i, b in enumerate(s["sites"])}
    config = sim_config(sites)
    config = config.model_copy(
        update={
            "fleet": config.fleet.model_copy(update={"max_nodes": s["max_nodes"], "node_watchdog": s["node_watchdog"]})
        }
    )
    # Metered: the hub holds sites back (expected far longer than its watch interval), the last sites first.
    expected = {name: 300.0 * (i + 1) for i, name in enumerate(sites)} if metered else None
    cloud = SimCloud(tmp, config, sites, expected=expected)
    cloud.start_hub(crash_after_writes=s["first_hub_crash_at_write"])

    def supervisor():  # the external watchdog: a hub that died is replaced after a while
        while not cloud.finished():
            cloud.clock.sleep(30)
            if cloud.hubs[-1].done and not cloud.finished():
                cloud.start_hub(at=cloud.clock.now() + 20)

    def chaos():
        start = cloud.clock.now()
        for kind, at, pick, length in sorted(s["faults"], key=lambda f: f[1]):
            cloud.clock.sleep(max(0.0, start + at - cloud.clock.now()))
            live = sorted(cloud.live())
            node = live[pick % len(live)] if live else None
            if kind == "crash_hub":
                cloud.crash_hub()
            elif kind == "duplicates":
                if cloud.duplicate_sends == 0:
                    cloud.duplicate_messages()
            elif node is None:
                continue
            elif kind == "kill_node":
                cloud.kill_node(node)
            elif kind == "reclaim_spot":
                cloud.kill_node(node, spot=True)
            elif kind == "spot_notice":
                cloud.spot_notice(node)
            elif kind == "partition":
                cloud.partition(node, length)
                cloud.clock.spawn("ec2", lambda n=node, t=length: (cloud.clock.sleep(t + 0.5), cloud.kill_node(n)))

    cloud.clock.spawn("supervisor", supervisor)
    cloud.clock.spawn("chaos", chaos)
    cloud.run()
    return cloud


EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@EXAMPLES
@given(schedule)
def test_the_invariants_hold_for_every_schedule_of_faults(s):
    assert_invariants(s, metered=False)


@EXAMPLES
@given(schedule)
def test_the_invariants_hold_for_every_schedule_of_faults_on_a_metered_queue(s):
    assert_invariants(s, metered=True)


def assert_invariants(s: dict, metered: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cloud = play(Path(tmp), s, metered)
        assert cloud.finished(), "the run did not end by itself"
        sites = {r.site: r for r in cloud.table.read_run(RUN).sites}
        behaviour = {f"s{i}": b for i, b in enumerate(s["sites"])}
        report = cloud.check()
        assert report.violations == [], report.violations
        assert cloud.concurrent == [], cloud.concurrent
        for name, r in sites.items():
            if r.run_status is RunStatus.COMPLETED:
                assert behaviour[name] in CAN_COMPLETE, (name, behaviour[name])
            else:
                allowed = FAILURE_REASONS.get(behaviour[name], {"hang", "error"}) | DISTURBED
                assert r.failure_reason in allowed, (name, behaviour[name], r.failure_reason)
