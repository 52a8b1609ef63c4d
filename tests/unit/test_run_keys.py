"""`RunKeys`, the export's one checked key object: its ids are checked once, and every key it derives is the key the
per-key functions of fleet/outputs/results.py make from the same ids."""

from __future__ import annotations

from unittest import mock

import pytest

from fleet.outputs import results as keys_mod
from fleet.outputs.results import (
    RunKeys,
    checked_result_key,
    evidence_key,
    evidence_prefix,
    quarantine_key,
    staged_quarantine_key,
    writer_id,
)


@pytest.mark.parametrize("run_id", ["2026-11-21", "2026-11-21-feeds"])
def test_each_key_is_the_one_the_per_key_functions_make(run_id):
    site = RunKeys.of(run_id, "20261121", "AROAEXAMPLE").site("shop")
    writer = writer_id("AROAEXAMPLE", "i-0123456789abcdef0")
    assert site.writer("i-0123456789abcdef0") == writer
    assert site.result == checked_result_key("shop", "20261121", run_id)
    assert site.staged_evidence_prefix(writer, 2) == evidence_prefix("shop", "20261121", run_id, writer) + "2/"
    assert site.evidence(2, "page.html") == evidence_key("shop", "20261121", run_id, 2, "page.html")
    assert site.staged_quarantine(writer, 3) == staged_quarantine_key(writer, "shop", "20261121", run_id, 3)
    assert site.quarantine(3) == quarantine_key(site.result, 3)


def test_the_run_is_checked_once_and_each_site_once_however_many_keys_follow():
    with mock.patch.object(keys_mod, "check_site_id", wraps=keys_mod.check_site_id) as site_checks:
        with mock.patch.object(keys_mod, "check_run_id", wraps=keys_mod.check_run_id) as run_checks:
            run = RunKeys.of("2026-11-21", "20261121")
            for name in ("a", "b"):
                site = run.site(name)
                for n in range(1, 4):
                    site.evidence(n, "evidence.json"), site.quarantine(n), site.result  # noqa: B018
    assert run_checks.call_count == 1 and site_checks.call_count == 2


@pytest.mark.parametrize(
    ("run_id", "run_date", "role", "named"),
    [
        ("../x", "20261121", "local", "run id"),
        ("2026-11-21", "2026112", "local", "run date"),
        ("2026-11-21", "20261121", "a:b", "role id"),
    ],
)
def test_a_run_whose_ids_are_not_ids_gets_no_keys(run_id, run_date, role, named):
    with pytest.raises(ValueError, match=named):
        RunKeys.of(run_id, run_date, role)


def test_a_site_that_is_not_a_site_id_and_a_bad_attempt_or_file_are_refused():
    run = RunKeys.of("2026-11-21", "20261121")
    with pytest.raises(ValueError):
        run.site("../etc")
    site = run.site("shop")
    with pytest.raises(ValueError, match="attempt"):
        site.evidence(0, "page.html")
    with pytest.raises(ValueError, match="evidence file"):
        site.evidence(1, "../../x")
    with pytest.raises(ValueError):
        site.writer("not-a-node")
