"""Faults survived, nothing lost: the real hub and node agents in virtual time, one fault per scenario.

Each scenario states what it breaks and what must happen, then runs the invariant checker
(`cli.report.check.check_run`): every site terminal, attempts within bounds and never overlapping, one result
per COMPLETED site, no instance or message of the run left. `cloud.concurrent` catches two live crawls
of one site at once. The harness (tests/helpers/fleet_sim.py) says what is faked and why.
"""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from fleet.record.state import RunStatus
from hub.control.aws import LadderControl, SshControl, SsmControl
from hub.providers.base import LaunchResult
from hub.snapshot import held
from tests.helpers.fleet_sim import RUN, SimCloud, SimProvider, sim_config

MIX = {"a": "ok", "b": "hang-once", "c": "error-once", "d": "slow", "e": "hang-always", "f": "error-always"}
EXPECTED = {
    "a": ("COMPLETED", None),
    "b": ("COMPLETED", None),
    "c": ("COMPLETED", None),
    "d": ("COMPLETED", None),
    "e": ("FAILED", "hang"),
    "f": ("FAILED", "error"),
}


def outcomes(cloud: SimCloud) -> dict[str, tuple[str, str | None]]:
    out = {}
    for r in cloud.table.read_run(RUN).sites:
        out[r.site] = (r.run_status.value, r.failure_reason if r.run_status is RunStatus.FAILED else None)
    return out


def assert_sound(cloud: SimCloud, *, no_losses: bool = False) -> None:
    """The invariants hold; with `no_losses` (no node was harmed in the scenario), no attempt ended `lost` or
    `spot` and no node was terminated as lost."""
    report = cloud.check()
    assert report.violations == [], report.violations
    assert cloud.concurrent == [], cloud.concurrent
    if no_losses:
        assert report.false_losses == 0, report.false_loss_details


def when(cloud: SimCloud, cond, then, poll_s: float = 1.0, name: str = "chaos") -> None:
    """A chaos actor: once `cond()` holds (looked at every `poll_s` of virtual time), do `then()`."""

    def body():
        while not cond():
            cloud.clock.sleep(poll_s)
        then()

    cloud.clock.spawn(name, body)


def crawling(cloud: SimCloud, site: str):
    """The instance crawling `site` right now (URL_CALL or CALL_DONE), or None."""
    r = cloud.site(site)
    if r is not None and r.run_status is RunStatus.RUN and r.site_status.value in ("URL_CALL", "CALL_DONE"):
        return r.instance_id
    return None


def test_a_plain_run_of_mixed_sites(tmp_path):
    cloud = SimCloud(tmp_path, sim_config(MIX), MIX)
    cloud.start_hub()
    cloud.run()
    assert outcomes(cloud) == EXPECTED
    assert_sound(cloud, no_losses=True)


@pytest.mark.parametrize("crash_at", list(range(1, 80, 3)))
def test_hub_sigkilled_between_any_two_of_its_writes_then_resumed(tmp_path, crash_at):
    """The hub dies at its n-th write (seeding, launching, mid-kill, mid-requeue, finishing...); a new hub
    started 30 s later resumes from the table and the provider. Same outcomes, nothing lost or doubled."""
    cloud = SimCloud(tmp_path, sim_config(MIX), MIX)
    first = cloud.start_hub(crash_after_writes=crash_at)
    when(cloud, lambda: first.done, lambda: cloud.start_hub(at=cloud.clock.now() + 30), name="restarter")
    cloud.run()
    assert outcomes(cloud) == EXPECTED
    assert_sound(cloud, no_losses=True)
    sent = cloud.queue.sent
    assert sent <= len(MIX) + 2 * 6 + 3  # first messages, requeues, at most a few repaired sends


#: A previous run's durations for MIX, far longer than the hub's watch interval: the hub meters its queue and holds
#: most sites back (three nodes: three messages, then one more for the next look).
MIX_EXPECTED = {"a": 400.0, "b": 900.0, "c": 300.0, "d": 1200.0, "e": 600.0, "f": 100.0}


def test_a_metered_queue_sends_longest_first_and_only_what_the_nodes_take(tmp_path):
    cloud = SimCloud(tmp_path, sim_config(MIX), MIX, expected=MIX_EXPECTED)
    held_when_all_busy: list[set[str]] = []

    def records():
        return cloud.table.read_run(RUN).sites

    when(
        cloud,
        lambda: sum(r.run_status is RunStatus.RUN for r in records()) == 3,
        lambda: held_when_all_busy.append({r.site for r in records() if held(r)}),
        poll_s=0.5,
    )
    cloud.start_hub()
    cloud.run()
    assert outcomes(cloud) == EXPECTED
    assert_sound(cloud, no_losses=True)
    firsts = sorted(records(), key=lambda r: (r.attempts[0].start, r.site))
    assert {r.site for r in firsts[:3]} == {"d", "b", "e"}  # the three longest expected, on the three nodes
    assert [r.site for r in firsts[3:]] == ["a", "c", "f"]  # then the rest, longest first
    assert len(held_when_all_busy) == 1 and held_when_all_busy[0] >= {"c", "f"}  # the shortest held back


@pytest.mark.parametrize("crash_at", list(range(1, 80, 3)))
def test_a_hub_metering_its_queue_sigkilled_between_any_two_of_its_writes_then_resumed(tmp_path, crash_at):
    """As above, with the queue metered: a hub that dies between sending a held site's message and marking it
    sent is replaced by one that sends it again (a duplicate the claim makes harmless). Same outcomes."""
    cloud = SimCloud(tmp_path, sim_config(MIX), MIX, expected=MIX_EXPECTED)
    first = cloud.start_hub(crash_after_writes=crash_at)
    when(cloud, lambda: first.done, lambda: cloud.start_hub(at=cloud.clock.now() + 30), name="restarter")
    cloud.run()
    assert outcomes(cloud) == EXPECTED
    assert_sound(cloud, no_losses=True)
    assert cloud.queue.sent <= len(MIX) + 2 * 6 + 3  # first messages, requeues, at most a few repaired sends


def test_node_agent_killed_mid_crawl_is_lost_and_the_site_retried_elsewhere(tmp_path):
    sites = {"a": "slow", "b": "ok"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.start_hub()
    victim = []
    when(cloud, lambda: crawling(cloud, "a"), lambda: (victim.append(crawling(cloud, "a")), cloud.kill_node(victim[0])))
    cloud.run()
    a = cloud.site("a")
    assert a.run_status is RunStatus.COMPLETED and [x.outcome for x in a.attempts] == ["lost", "completed"]
    assert a.attempts[0].instance_id == victim[0] != a.attempts[1].instance_id
    assert_sound(cloud)


def test_a_spot_notice_mid_crawl_gives_the_attempt_back(tmp_path):
    sites = {"a": "slow"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.start_hub()
    when(cloud, lambda: crawling(cloud, "a"), lambda: cloud.spot_notice(crawling(cloud, "a")))
    cloud.run()
    a = cloud.site("a")
    assert [x.outcome for x in a.attempts] == ["spot", "completed"]
    assert (a.attempt, a.spot_requeues) == (1, 1)
    assert_sound(cloud)


def test_an_instance_reclaimed_without_notice_does_not_spend_an_attempt(tmp_path):
    sites = {"a": "slow"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.start_hub()
    when(cloud, lambda: crawling(cloud, "a"), lambda: cloud.kill_node(crawling(cloud, "a"), spot=True))
    cloud.run()
    a = cloud.site("a")
    assert [x.outcome for x in a.attempts] == ["spot", "completed"] and a.attempt == 1
    assert_sound(cloud)


def test_duplicate_deliveries_never_crawl_a_site_twice(tmp_path):
    cloud = SimCloud(tmp_path, sim_config(MIX), MIX)
    cloud.duplicate_messages()
    cloud.start_hub()
    cloud.run()
    assert cloud.duplicate_sends >= len(MIX)
    assert outcomes(cloud) == EXPECTED
    assert [len(cloud.site(s).attempts) for s in "ad"] == [1, 1]
    assert_sound(cloud, no_losses=True)


def test_a_zombie_finishing_after_its_site_was_reassigned_writes_nothing(tmp_path):
    """Node A is cut off mid-crawl: the hub cannot reach it, terminates it (EC2 says so), requeues the site,
    node B completes it. A comes back 120 s later and finishes its crawl: its writes are fenced off, the
    result stays B's. Meanwhile B waits for the profile lock A still holds (given back, not counted). The
    terminate EC2 accepted takes effect as A resurfaces."""
    sites = {"a": "slow"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.start_hub()
    zombie = []

    def cut_off():
        zombie.append(crawling(cloud, "a"))
        cloud.partition(zombie[0], 120)
        cloud.clock.spawn("ec2", lambda: (cloud.clock.sleep(120.5), cloud.kill_node(zombie[0])))

    when(cloud, lambda: crawling(cloud, "a"), cut_off)
    cloud.run()
    a = cloud.site("a")
    assert a.run_status is RunStatus.COMPLETED
    # lost (declared dead, terminated), busy (the zombie still held the profile lock: given back), completed
    assert [x.outcome for x in a.attempts] == ["lost", "busy", "completed"]
    assert a.attempts[0].kill_path == "terminate" and (a.attempt, a.spot_requeues) == (2, 1)
    body = json.loads(cloud.results.get(a.result_key))
    assert body["instance_id"] == a.attempts[-1].instance_id != zombie[0]
    assert cloud.results.refused == 0  # the zombie never even tried to write: its heartbeat was fenced first
    assert_sound(cloud)


def test_a_crawl_longer_than_the_visibility_timeout_is_not_delivered_again(tmp_path):
    sites = {"long": "slow"}  # 150 s of crawling; messages are invisible for 30 s at a time
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.start_hub()
    cloud.run()
    assert [x.outcome for x in cloud.site("long").attempts] == ["completed"]
    assert cloud.queue.sent == 1
    assert_sound(cloud, no_losses=True)


class FailingSsm:
    """SSM that cannot deliver: the faults moto cannot produce (it always answers Success)."""

    def __init__(self, how: str):
        self.how = how

    def send_command(self, **kw):
        if self.how == "InvalidInstanceId":
            raise ClientError({"Error": {"Code": "InvalidInstanceId", "Message": "not managed"}}, "SendCommand")
        return {"Command": {"CommandId": "c-1"}}

    def get_command_invocation(self, **kw):
        return {"Status": self.how, "StandardOutputContent": "", "StandardErrorContent": "no agent"}

    def cancel_command(self, **kw):
        return {}


@pytest.mark.parametrize("how", ["InvalidInstanceId", "Failed", "TimedOut"])
def test_ssm_failing_then_ssh_failing_ends_in_terminate(tmp_path, how):
    sites = {"h": "hang-once"}
    config = sim_config(sites)
    config = config.model_copy(update={"fleet": config.fleet.model_copy(update={"node_watchdog": False})})
    cloud = SimCloud(tmp_path, config, sites)
    ladder = LadderControl(
        [
            SsmControl(FailingSsm(how), cloud.clock, timeout_s=20),
            SshControl(lambda iid: None, user="admin", key_path="/nonexistent", host_keys=None),
        ]
    )
    cloud.start_hub(control=ladder)
    cloud.run()
    h = cloud.site("h")
    assert h.run_status is RunStatus.COMPLETED
    assert [x.outcome for x in h.attempts] == ["hang", "completed"] and h.attempts[0].kill_path == "terminate"
    killed = h.attempts[0].instance_id
    assert cloud.instances[killed]["actor"].done  # the last rung: terminated
    assert_sound(cloud, no_losses=True)


def test_a_result_already_in_s3_means_done_without_a_crawl(tmp_path):
    sites = {"a": "ok", "b": "ok"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.results.put_new("a/20261121/result.json", b'{"from": "earlier"}')
    cloud.start_hub()
    cloud.run()
    a = cloud.site("a")
    assert a.run_status is RunStatus.COMPLETED and [x.outcome for x in a.attempts] == ["skipped"]
    assert "a" not in cloud.attempt_counter  # never crawled
    assert json.loads(cloud.results.get("a/20261121/result.json")) == {"from": "earlier"}
    assert_sound(cloud, no_losses=True)


def test_a_poison_message_goes_to_the_dlq_is_reported_and_the_run_still_ends(tmp_path):
    sites = {"a": "ok"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.queue.send_raw("this is not a site message")
    cloud.start_hub()
    cloud.run()
    assert outcomes(cloud) == {"a": ("COMPLETED", None)}
    assert len(cloud.queue.dlq) == 1
    summary = json.loads((tmp_path / "runs" / RUN / "summary.json").read_text())
    assert summary["queue"]["dlq"] == 1
    report = cloud.check()
    assert report.ok and any("not a site message" in n for n in report.notes)


def test_a_stale_profile_of_a_dead_host_is_cleaned_and_used(tmp_path):
    sites = {"a": "ok"}
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    profile = tmp_path / "efs" / "profiles" / "a"
    profile.mkdir(parents=True)
    (profile / "SingletonLock").symlink_to("deadhost-4242")
    (profile / "Cookies").write_text("kept")
    cloud.start_hub()
    cloud.run()
    assert cloud.site("a").run_status is RunStatus.COMPLETED
    assert not (profile / "SingletonLock").is_symlink() and (profile / "Cookies").read_text() == "kept"
    assert_sound(cloud, no_losses=True)


def test_capacity_errors_at_launch_back_off_and_no_site_is_dropped(tmp_path):
    cloud = SimCloud(tmp_path, sim_config(MIX), MIX)
    provider = SimProvider(cloud)
    real, refusals = provider.launch, [3]

    def launch(run_id, count, target=None):
        if refusals[0] > 0:
            refusals[0] -= 1
            return LaunchResult(
                (),
                ("spot t3.medium: InsufficientInstanceCapacity", "on-demand t3.medium: InsufficientInstanceCapacity"),
            )
        return real(run_id, count, target)

    provider.launch = launch
    cloud.start_hub(provider=provider)
    cloud.run()
    assert outcomes(cloud) == EXPECTED
    assert_sound(cloud, no_losses=True)


@pytest.mark.parametrize("skew", [-300.0, 300.0])
def test_five_minutes_of_clock_skew_between_hub_and_nodes_kills_nothing_by_mistake(tmp_path, skew):
    cloud = SimCloud(tmp_path, sim_config(MIX), MIX, node_clock_skew_s=skew)
    cloud.start_hub()
    cloud.run()
    assert outcomes(cloud) == EXPECTED
    for s in "ad":  # ok and slow-but-alive: one clean attempt each
        assert [x.outcome for x in cloud.site(s).attempts] == ["completed"]
    assert cloud.kills == []  # only the nodes' own watchdogs killed (the hung sites), never the hub
    assert_sound(cloud, no_losses=True)


def test_a_node_whose_bootstrap_fails_is_terminated_and_replaced(tmp_path):
    sites = {"a": "slow", "b": "slow"}  # the healthy node is busy with one site for 150 s: the other needs a node
    cloud = SimCloud(tmp_path, sim_config(sites), sites)
    cloud.duds = 1
    cloud.start_hub()
    cloud.run()
    dud = next(i for i, inst in cloud.instances.items() if inst["dud"])
    assert cloud.instances[dud]["actor"].done  # terminated after boot_timeout_s
    assert len(cloud.instances) >= 3  # and replaced
    assert outcomes(cloud) == {"a": ("COMPLETED", None), "b": ("COMPLETED", None)}
    assert all(len(cloud.site(s).attempts) == 1 for s in sites)
    assert_sound(cloud, no_losses=True)


def test_two_hubs_racing_to_requeue_one_hung_site_send_exactly_one_message(tmp_path):
    """An old hub and a new one (or a hub and a restarted one) decide the same kill in the same instant."""
    sites = {"h": "hang-once"}
    config = sim_config(sites)
    config = config.model_copy(update={"fleet": config.fleet.model_copy(update={"node_watchdog": False})})
    cloud = SimCloud(tmp_path, config, sites)
    cloud.start_hub()
    cloud.start_hub()
    cloud.run()
    h = cloud.site("h")
    assert [x.outcome for x in h.attempts] == ["hang", "completed"]
    assert cloud.queue.sent == 2  # the first message and exactly one requeue
    assert len(cloud.kills) == 1
    assert_sound(cloud, no_losses=True)
