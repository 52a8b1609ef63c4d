"""The hub instance lost mid-run on the EC2 twin, and the fleet it leaves crawling under the hub that replaces it.

Two nodes crawl two slow sites through the hub's Selenium Grid (Chromium, the `links` crawler). While both sites
are being crawled, the hub instance is terminated (the fault injected, as EC2 would lose it); the watchdog's
passes, on the twin's clock, see its heartbeat stop and start another hub for the same run. That hub boots its
user-data, finds the run's Grid secret in the SSM parameter and keeps it, so the two nodes' Grid nodes, which
learnt the secret once when their nodes booted, register with its Grid; the sites they held end COMPLETED on
them (the attempt the lost Grid cut short, then one that resumes from its checkpoint), and the run ends.
Nothing is called directly that AWS would call. Root only (see conftest).

The new hub's Grid must be where the nodes look for it: their user-data names the first hub's address. The twin
gives an instance the lowest free address, so the replacement, booted while the two nodes keep theirs, gets the
address the lost hub had (on AWS: `aws.hub_address` naming an address that moves to the new hub).
"""

from __future__ import annotations

import copy
import re

import pytest

from twin.day import TwinDay, wait_until

#: Slow pages (3 s each), so that the hub is lost while both sites are crawled.
SITE_PAGES = 10
SITES = {name: f"/s/{name}/?pages={SITE_PAGES}&delay_s=3" for name in ("lost-a", "lost-b")}
#: The watchdog's jumps move the twin's clock ahead by minutes: the run's deadline leaves room for them. A crawl's
#: WebDriver commands go through the hub's Grid router, so the crawls running when the hub is lost fail; their
#: nodes see that no Grid lists them, give those attempts back (no fault of the sites') and wait for the next hub.
RUN = {"deadline_s": 1800}
#: Bounded by its own waits (each named, with its time): a hub's boot, the watchdog, another hub's boot, the crawl.
pytestmark = pytest.mark.timeout(1500)


def hubs(d: TwinDay) -> list:
    return [b for b in d.twin.boots if b.role == "hub"]


@pytest.fixture(scope="module")
def lost(twin_stack):
    d = twin_stack
    d.ensure_deployed()
    saved = copy.deepcopy(d.config)  # put_config merges into the deployment's config: the next module gets it back
    try:
        d.put_config(SITES, run=RUN)
        before = len(hubs(d))
        run_id = d.start_by_schedule()
        first = wait_until(lambda: hubs(d)[before:], 120, "the run's hub booting")[0]
        held = {site: wait_until(lambda s=site: d.node_of(s, run_id, "RUN", min_pages=1), 480, f"{site} being crawled",
                                 explain=d.processes) for site in SITES}  # fmt: skip
        d.twin.client("ec2").terminate_instances(InstanceIds=[first.instance_id])
        wait_until(lambda: first.instance_id not in d.twin.ec2twin.running, 60, "the hub's processes ended")
        restarted = d.restart_by_watchdog()
        wait_until(lambda: d.stack_idle() and d.summary(run_id), 900, "the run archived and the stack idle",
                   explain=d.processes)  # fmt: skip
        d.lost = {"run_id": run_id, "first": first, "held": held, "restarted": restarted, "hubs": hubs(d)[before:]}
        yield d
    finally:
        d.config.clear()
        d.config.update(saved)


def grid_secret(boot) -> str:
    return (boot.sandbox.dir / "etc" / "gridfleet" / "grid-secret").read_text()


def boot_log(boot) -> str:
    return (boot.sandbox.var_log / "gridfleet-boot.log").read_text()


def test_the_watchdog_started_one_hub_for_the_run_where_the_lost_one_was(lost):
    first, hubs_of_run = lost.lost["first"], lost.lost["hubs"]
    assert [b.instance_id for b in hubs_of_run][:1] == [first.instance_id] and len(hubs_of_run) == 2, hubs_of_run
    replacement = hubs_of_run[1]
    assert [r["instance_id"] for r in lost.lost["restarted"]["restarted"]] == [replacement.instance_id]
    assert replacement.sandbox.address == first.sandbox.address  # where the nodes' user-data says the Grid is


def test_the_new_hub_kept_the_runs_grid_secret(lost):
    run_id, (first, replacement) = lost.lost["run_id"], lost.lost["hubs"]
    assert grid_secret(first) == grid_secret(replacement)
    assert f"a new Grid secret for run {run_id} is in the SSM parameter" in boot_log(first)
    assert f"holds the Grid secret of run {run_id} already: this hub keeps it" in boot_log(replacement)
    ssm = lost.twin.client("ssm")
    name = f"/{lost.stack}/grid-secret"
    value = ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
    assert value == f"{run_id} {grid_secret(first).strip()}"


def added_nodes(boot) -> dict[str, str]:
    """The Grid nodes the hub's Grid took, by address: their Grid node ids (each Grid node makes its id at start)."""
    grid_log = (boot.sandbox.var_log / "gridfleet-grid.log").read_text(errors="replace")
    return {m[2]: m[1] for m in re.finditer(r"Added node (\S+) at http://([0-9.]+):\d+", grid_log)}


def test_the_grid_nodes_that_were_running_registered_with_the_new_hubs_grid(lost):
    """The same Grid nodes, not new ones: each node's Grid node, started once at its boot with the secret it read
    then, registered with the first Grid and then with the second; the second Grid refused no one."""
    first, replacement = lost.lost["hubs"]
    boots = {b.instance_id: b for b in lost.twin.boots}
    addresses = {boots[node].sandbox.address for node in lost.lost["held"].values()}
    before, after = added_nodes(first), added_nodes(replacement)
    assert addresses <= set(after) and all(after[a] == before[a] for a in addresses), (addresses, before, after)
    grid_log = (replacement.sandbox.var_log / "gridfleet-grid.log").read_text(errors="replace")
    assert "Rejecting message without a valid secret" not in grid_log


def test_the_sites_they_held_ended_completed_on_them_and_the_run_finished(lost):
    summary = lost.summary(lost.lost["run_id"])
    assert summary["finish_reason"] == "done", summary["finish_reason"]
    sites, nodes = summary["sites"], set(lost.lost["held"].values())
    assert {name: s["run_status"] for name, s in sites.items()} == dict.fromkeys(SITES, "COMPLETED")
    assert summary["nodes"]["launched"] == len(nodes) == 2  # the new hub launched none: the two went on
    for name, s in sites.items():
        attempts = s["attempts"]
        assert {a["instance_id"] for a in attempts} <= nodes, (name, attempts)  # no other node crawled it
        # the attempt the lost Grid cut short (given back), then one that resumed where it stopped
        assert [a["outcome"] for a in attempts] == ["busy", "completed"], (name, attempts)
        assert 0 < attempts[-1]["pages"] < SITE_PAGES, (name, attempts)


def test_nothing_of_the_run_is_left(lost):
    states = lost.instance_states()
    assert states and set(states.values()) == {"terminated"}, states
    assert not lost.twin.errors, lost.twin.errors
