"""`gridfleet rerun` on the real hub and agents in virtual time: failed sites crawled again with fresh attempts,
a forced rerun of a COMPLETED site keeps its old result aside, and the run ends sound each time."""

from __future__ import annotations

import json

import pytest

from cli.commands.rerun import choose, reopen
from fleet.errors import UsageError
from fleet.record.state import RunStatus
from tests.helpers.fleet_sim import RUN, SimCloud, sim_config

SITES = {"a": "ok", "e": "hang-always", "f": "error-always"}


def finished_cloud(tmp_path) -> SimCloud:
    cloud = SimCloud(tmp_path, sim_config(SITES), dict(SITES))
    cloud.start_hub()
    cloud.run()
    return cloud


def rerun(cloud: SimCloud, names=(), *, failed=False, force=False) -> list[str]:
    rows = cloud.table.read_run(RUN)
    records = {r.site: r for r in rows.sites}
    choice = choose(records, names, failed=failed, force=force)
    done = reopen(
        run_id=RUN,
        run=rows.run,
        records=records,
        choice=choice,
        table=cloud.table,
        queue=cloud.queue,
        results=cloud.results,
        config=cloud.config,
        now=cloud.clock.now(),
    )
    cloud.start_hub()
    cloud.run()
    return done


def test_rerun_of_the_failed_sites_gives_them_fresh_attempts_and_the_run_ends_sound_again(tmp_path):
    cloud = finished_cloud(tmp_path)
    assert cloud.site("e").run_status is RunStatus.FAILED and cloud.site("e").attempt == 3
    cloud.behaviours["e"] = "ok"  # the cause of e's hangs is gone; f still errors every time
    assert rerun(cloud, failed=True) == ["e", "f"]
    e, f, a = cloud.site("e"), cloud.site("f"), cloud.site("a")
    assert (e.run_status, e.attempt, e.attempt_base) == (RunStatus.COMPLETED, 4, 3)  # one fresh attempt was enough
    assert [x.outcome for x in e.attempts] == ["hang", "hang", "hang", "completed"]  # the history is kept
    assert (f.run_status, f.attempt, f.failure_reason) == (RunStatus.FAILED, 6, "error")  # three fresh, all spent
    assert a.attempt == 1 and len(a.attempts) == 1  # a COMPLETED site is not touched by --failed
    run = cloud.table.get_run(RUN)
    assert run.finished and run.reruns == 1
    report = cloud.check()
    assert report.violations == [] and cloud.concurrent == []
    summary = json.loads((tmp_path / "runs" / RUN / "summary.json").read_text())
    assert summary["sites"]["e"]["run_status"] == "COMPLETED" and summary["sites"]["e"]["attemptCount"] == 4


def test_a_forced_rerun_crawls_a_completed_site_again_and_keeps_its_old_result_aside(tmp_path):
    cloud = finished_cloud(tmp_path)
    old_key = cloud.site("a").result_key
    old_body = cloud.results.get(old_key)
    assert rerun(cloud, ["a"], force=True) == ["a"]
    a = cloud.site("a")
    assert a.run_status is RunStatus.COMPLETED and a.attempt == 2 and a.result_key == old_key
    kept = [k for k in cloud.results.keys("a/") if ".replaced-" in k]
    assert len(kept) == 1 and cloud.results.get(kept[0]) == old_body
    assert cloud.check().violations == []  # still exactly one result.json for the site


def test_choose_names_unknown_sites_and_skips_what_must_not_be_crawled_again(tmp_path):
    cloud = finished_cloud(tmp_path)
    records = {r.site: r for r in cloud.table.read_run(RUN).sites}
    with pytest.raises(UsageError, match="no site 'zz', 'yy' in this run"):
        choose(records, ["e", "zz", "yy"], failed=False, force=False)
    c = choose(records, ["a", "e"], failed=False, force=False)
    assert c.sites == ["e"] and "has a result already" in c.skipped["a"] and "--force" in c.skipped["a"]
    assert choose(records, [], failed=True, force=False).sites == ["e", "f"]
    cloud.clock.shutdown()


def test_a_site_still_running_is_left_to_the_hub_that_runs_it(tmp_path):
    cloud = SimCloud(tmp_path, sim_config({"d": "slow"}), {"d": "slow"})
    cloud.start_hub()
    cloud.run(until=cloud.clock.now() + 40)  # d is being crawled
    records = {r.site: r for r in cloud.table.read_run(RUN).sites}
    c = choose(records, ["d"], failed=False, force=True)
    assert c.sites == [] and "still RUN" in c.skipped["d"]
    cloud.clock.shutdown()
