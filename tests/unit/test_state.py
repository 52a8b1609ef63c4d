"""The site record's state machine: legal moves pass, illegal ones raise, versions move."""

import dataclasses

import pytest

from fleet.errors import IllegalTransition
from fleet.record.state import (
    RUN_TRANSITIONS,
    SITE_TRANSITIONS,
    RunStatus,
    SiteRecord,
    SiteSpec,
    SiteStatus,
    transition,
)

SPEC = SiteSpec("http://example.test/")


def rec(**kw) -> SiteRecord:
    return dataclasses.replace(SiteRecord("r1", "s1", SPEC), **kw)


def test_claim_starts_an_attempt_and_bumps_version():
    new = transition(rec(), run_status=RunStatus.RUN, site_status=SiteStatus.PENDING, attempt=1, instance_id="i-1")
    assert (new.run_status, new.attempt, new.version) == (RunStatus.RUN, 1, 1)


def test_claim_must_count_exactly_one_attempt():
    with pytest.raises(IllegalTransition):
        transition(rec(), run_status=RunStatus.RUN, site_status=SiteStatus.PENDING, attempt=2)


def test_crawler_progress_follows_the_site_table():
    r = rec(run_status=RunStatus.RUN, site_status=SiteStatus.RUNNING, attempt=1, instance_id="i-1")
    r = transition(r, site_status=SiteStatus.URL_CALL)
    r = transition(r, site_status=SiteStatus.CALL_DONE)
    r = transition(r, site_status=SiteStatus.URL_CALL)
    assert r.version == 3
    with pytest.raises(IllegalTransition):
        transition(r, site_status=SiteStatus.RUNNING)  # URL_CALL -> RUNNING is not an edge


@pytest.mark.parametrize("terminal", [RunStatus.COMPLETED, RunStatus.FAILED])
def test_terminal_statuses_have_no_way_out(terminal):
    site = SiteStatus.COMPLETED if terminal is RunStatus.COMPLETED else SiteStatus.FAILED
    r = rec(run_status=terminal, site_status=site, attempt=1)
    for target in RunStatus:
        if target is terminal:
            continue
        with pytest.raises(IllegalTransition):
            transition(r, run_status=target, site_status=SiteStatus.PENDING)
    assert RUN_TRANSITIONS[terminal] == {}


def test_status_pairs_are_enforced():
    r = rec(run_status=RunStatus.RUN, site_status=SiteStatus.URL_CALL, attempt=1, instance_id="i-1")
    with pytest.raises(IllegalTransition):
        transition(r, run_status=RunStatus.COMPLETED)  # COMPLETED needs site_status COMPLETED


def test_writes_without_bump_cannot_change_status_or_version():
    r = rec(run_status=RunStatus.RUN, site_status=SiteStatus.RUNNING, attempt=1, instance_id="i-1", version=4)
    beat = transition(r, bump=False, heartbeat=123.0)
    assert beat.version == 4 and beat.heartbeat == 123.0
    with pytest.raises(IllegalTransition):
        transition(r, bump=False, site_status=SiteStatus.URL_CALL)


def test_attempt_cannot_change_during_an_attempt():
    r = rec(run_status=RunStatus.RUN, site_status=SiteStatus.RUNNING, attempt=1, instance_id="i-1")
    with pytest.raises(IllegalTransition):
        transition(r, attempt=2)


def test_every_site_status_has_an_entry():
    assert set(SITE_TRANSITIONS) == set(SiteStatus)
    assert set(RUN_TRANSITIONS) == set(RunStatus)


def test_a_coalesced_progress_write_may_skip_steps_but_never_go_back():
    """A node writing its progress with its heartbeat jumps along the crawler's path in one write."""
    r = rec(run_status=RunStatus.RUN, site_status=SiteStatus.PENDING, attempt=1, instance_id="i-1")
    assert transition(r, site_status=SiteStatus.CALL_DONE).site_status is SiteStatus.CALL_DONE
    running = transition(r, site_status=SiteStatus.URL_CALL)
    assert transition(running, site_status=SiteStatus.CALL_DONE).site_status is SiteStatus.CALL_DONE
    for back in (SiteStatus.PENDING, SiteStatus.RUNNING):
        with pytest.raises(IllegalTransition):
            transition(running, site_status=back)
