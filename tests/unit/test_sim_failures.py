"""The simulator's failures by class: the crawls fail as `--fail-rate` / `--fail-sites` say, the nodes settle them
through the node protocol with `run.retry`'s rules (taken from the config), and the hub sends a waiting retry once
its backoff ends."""

import dataclasses
import json

import pytest

from cli.main import main
from fleet.config import Config
from fleet.record.failures import Failure, FailureClass
from fleet.record.state import RunStatus
from sim.model import SimParams
from sim.run import Sim
from sim.workload import failure_for

CALM = SimParams(sites=40, nodes=8, seed=3, hang_rate=0.0, spot_per_hour=0.0, capacity_error_rate=0.0)


def _run(**kw):
    sim = Sim(dataclasses.replace(CALM, **kw))
    result = sim.run()
    return result, {r.site: r for r in sim.table.read_run(sim.run_id).sites}, sim


def _config(run):
    return Config.model_validate({"run": run, "sites": [{"id": "x", "start_url": "https://x.test/"}]})


def _waits(rec):
    """(the failed attempt's class, the wait until the next attempt) for each retry of the site."""
    at = rec.attempts
    return [(a.failure_class, b.start - a.end) for a, b in zip(at, at[1:], strict=False)]


def test_keys_name_a_class_or_an_http_status_as_the_crawler_classes_it():
    assert failure_for("dns") == Failure(FailureClass.DNS)
    assert failure_for("http_404") == Failure(FailureClass.HTTP_4XX, 404)
    assert failure_for("http_503") == Failure(FailureClass.HTTP_5XX, 503)
    assert failure_for("http_403") == Failure(FailureClass.BLOCKED, 403)
    for bad in ("hang", "http_4xx", "http_200", "http_1000", "nope", ""):
        with pytest.raises(ValueError, match="http_<status>"):
            failure_for(bad)


def test_a_404_share_fails_at_once_one_attempt_each():
    r, sites, sim = _run(failing_sites={"http_404": 0.25})
    gone = {s for s, rec in sites.items() if rec.run_status is RunStatus.FAILED}
    assert gone == set(sim.workload.failing) and len(gone) == 10
    assert all(len(sites[s].attempts) == 1 and sites[s].http_status == 404 for s in gone)
    assert (r.completed, r.failed) == (30, 10)
    assert r.failures == {"http_4xx 404": 10} and r.attempts == {"completed": 30, "error": 10}


def test_a_503_retry_waits_out_the_configs_backoff_and_then_completes():
    config = _config({"max_attempts": 6, "retry": {"http_503": {"backoff_s": 600, "factor": 1}}})
    r, sites, _ = _run(failure_rates={"http_503": 0.3}, config=config)
    waits = [w for rec in sites.values() for w in _waits(rec)]
    assert waits and all(cls == "http_5xx" and wait >= 600 for cls, wait in waits)  # the hub sent it after 600 s
    assert (r.completed, r.failed) == (40, 0)
    assert r.failures == {"http_5xx 503": len(waits)} and r.retry_wait_max_s >= 600
    quick, _, _ = _run(failure_rates={"http_503": 0.3}, config=_config({"max_attempts": 6}))
    assert quick.makespan_s < r.makespan_s  # the default rule's minute costs less than ten


def test_a_blocked_sites_retry_goes_to_another_node():
    r, sites, sim = _run(failing_sites={"blocked": 0.1})
    blocked = [sites[s] for s in sim.workload.failing]
    assert len(blocked) == 4 and all(rec.run_status is RunStatus.FAILED for rec in blocked)
    for rec in blocked:
        at = rec.attempts
        assert len(at) == 3 and all(a.failure_class == "blocked" for a in at)
        assert all(a.instance_id != b.instance_id for a, b in zip(at, at[1:], strict=False))
        assert all(wait >= 300 for _, wait in _waits(rec))  # the default rule: 5 minutes, on another node
    assert r.failures == {"blocked": 12}


def test_failures_by_class_are_counted_per_attempt():
    r, sites, _ = _run(failure_rates={"dns": 0.2, "crash": 0.1}, config=_config({"max_attempts": 8}))
    by_class: dict[str, int] = {}
    for rec in sites.values():
        for a in rec.attempts:
            if a.failure_class:
                by_class[a.failure_class] = by_class.get(a.failure_class, 0) + 1
    assert set(by_class) == {"dns", "crash"} and r.failures == dict(sorted(by_class.items()))
    assert r.completed == 40 and r.attempts["error"] == sum(by_class.values())


def test_the_same_seed_crawls_the_same_sites_with_failures_drawn_apart():
    plain = Sim(CALM).workload
    failing = Sim(dataclasses.replace(CALM, failure_rates={"timeout": 0.5})).workload
    assert plain.today == failing.today


def test_simulate_takes_failure_rates_on_the_command_line(capsys):
    argv = ["simulate", "--sites", "20", "--nodes", "4", "--seed", "2"]
    assert main([*argv, "--fail-sites", "http_404=0.25", "--fail-rate", "http_503=0.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["failures"]["http_4xx 404"] == 5 and out["failed"] >= 5 and out["makespan_s"] > 0
    assert main([*argv, "--fail-sites", "http_404=0.25"]) == 0
    assert "http_4xx 404 5" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--fail-rate", "http_4xx=0.1"],
        ["--fail-rate", "dns"],
        ["--fail-rate", "dns=2"],
        ["--fail-sites", "hang=0.1"],
        ["--fail-sites", "http_404=0.7", "--fail-sites", "dns=0.5"],
    ],
)
def test_a_bad_failure_option_is_one_line_and_exit_2(capsys, argv):
    try:
        code = main(["simulate", *argv])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("error:") == 1
    (line,) = [x for x in err.splitlines() if "error:" in x]
    assert "--fail-" in line
