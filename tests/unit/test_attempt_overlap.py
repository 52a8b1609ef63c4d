"""A result is saved while its crawler closes the browser: the order the protocol needs is kept, and a fenced
attempt still writes nothing. On the agent rig (fakes, injected clock); the spare crawler processes are real."""

from __future__ import annotations

import logging
import os
import sys
import threading

from fleet.record.state import Reason, RunStatus, SiteStatus
from node.closing import Closer
from node.phases import phase_timings
from node.runner import ChildProcess, Exited, SpareCrawlers
from tests.helpers.fake_node import Rig, pages_script
from tests.unit.test_agent import hub_marks_before_each_beat


def recorded(rig):
    """Every step that matters to the order, in the order it happens, with whether the site's lock was held."""
    steps: list[tuple[str, bool]] = []

    def held():
        return "s1" in rig.agent.profiles.held()

    put, write, delete = rig.results.put_staged, rig.table.write, rig.queue.delete

    def put_staged(key, body, *rest):
        steps.append(("put", held()))
        return put(key, body, *rest)

    def table_write(old, new):
        if new.site_status is SiteStatus.SAVED and old.site_status is not SiteStatus.SAVED:
            steps.append(("saved", held()))
        return write(old, new)

    def queue_delete(msg):
        steps.append(("delete", held()))
        return delete(msg)

    rig.results.put_staged, rig.table.write, rig.queue.delete = put_staged, table_write, queue_delete
    start = rig.agent.start_crawl

    def start_crawl(job, log_path):
        crawl = start(job, log_path)
        close = crawl.close

        def closing(grace_s=0):
            steps.append(("close", held()))
            close(grace_s)

        crawl.close = closing
        return crawl

    rig.agent.start_crawl = start_crawl
    rig.agent.cleanup = lambda profile, session, forced: steps.append(("cleanup", held()))
    return steps


def test_the_result_is_staged_before_saved_and_both_before_the_browser_is_closed(tmp_path):
    rig = Rig(tmp_path, [pages_script(2)])
    rig.seed()
    steps = recorded(rig)
    rig.agent.run()
    assert rig.site().run_status is RunStatus.COMPLETED
    assert [name for name, _ in steps] == ["put", "saved", "delete", "close", "cleanup"]
    assert all(held for _, held in steps)  # the profile stays locked until its browser is gone
    assert rig.agent.profiles.held() == []
    assert rig.crawls[0].closed_with and rig.crawls[0].closed_with > 0  # it quits its own browser meanwhile


def test_a_fenced_attempt_saves_nothing_while_its_browser_closes(tmp_path):
    rig = Rig(tmp_path, [pages_script(2)], heartbeat_interval_s=5)  # no beat before the save's own
    rig.seed()
    steps = recorded(rig)
    hub_marks_before_each_beat(rig, Reason.HANG)  # the save's own heartbeat (still ours?) is fenced
    rig.agent.run()
    rec = rig.site()
    assert rec.run_status is RunStatus.RUN and rec.kill_reason == "hang"
    assert rig.results.objects == {}
    assert [name for name, _ in steps] == ["delete", "close", "cleanup"]  # only its message dropped
    assert rig.agent.profiles.held() == []


def test_the_completed_line_has_every_phase_once_the_node_is_free(tmp_path, caplog):
    script = pages_script(2)
    script[0] = (0.5, {"event": "session", "id": "sess-1", "request_s": 0.4})
    rig = Rig(tmp_path, [script])
    rig.seed()
    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        rig.agent.run()
    [fields] = [r.fields for r in caplog.records if getattr(r, "event", None) == "completed"]
    keys = ("check_s", "lock_s", "browser_s", "crawl_s", "save_s", "close_s", "release_s", "busy_s", "request_s")
    assert set(keys) <= set(fields)
    assert fields["request_s"] == "0.40" and fields["ckpt_s"] == "0.00"
    busy = float(fields["busy_s"])
    assert busy >= float(fields["crawl_s"]) + float(fields["browser_s"])  # everything, from claim to the node free


def test_phase_timings_take_the_phases_whose_marks_were_passed():
    marks = {"claim": 10.0, "checked": 10.1, "locked": 10.3, "spawn": 10.35, "session": 11.0}
    out = phase_timings(marks, {"request_s": 0.5})
    assert out == {
        "setup_s": "0.35",
        "check_s": "0.10",
        "lock_s": "0.20",
        "browser_s": "0.65",
        "request_s": "0.50",
    }


# --- spare crawler processes (real processes) -------------------------------------------------------------------
JOB = {"site": "s1", "start_url": "http://x.test/", "crawler": "no.such:Crawler", "attempt": 1, "node_id": "i-1"}
JOB |= {"grid_url": "", "profile_dir": "/nonexistent"}


def first_event(proc) -> dict | Exited:
    for _ in range(100):
        ev = proc.next_event(0.5)
        if ev is not None:
            return ev
    raise AssertionError("no event from the crawler process")


def test_a_prepared_spare_takes_the_next_job(tmp_path):
    spares = SpareCrawlers(tmp_path / "crawler.log")
    spares.prepare()
    spare_pid = spares._spare.pid
    spares.prepare()  # one spare at a time
    assert spares._spare.pid == spare_pid
    proc = spares.start(JOB, tmp_path / "crawler.log")
    try:
        assert proc.pid == spare_pid
        ev = first_event(proc)
        assert isinstance(ev, dict) and ev["event"] == "error" and "no.such" in ev["message"]
    finally:
        proc.close()
    assert spares._spare is None


def test_without_a_spare_or_with_a_dead_one_a_new_process_is_started(tmp_path):
    spares = SpareCrawlers(tmp_path / "crawler.log")
    spares.prepare()
    dead = spares._spare.pid
    os.killpg(dead, 9)
    spares._spare.proc.wait(5)
    proc = spares.start(JOB, tmp_path / "crawler.log")
    try:
        assert proc.pid != dead
        assert first_event(proc)["event"] == "error"
    finally:
        proc.close()


def test_an_unneeded_spare_ends_quietly(tmp_path):
    spare = ChildProcess(None, tmp_path / "crawler.log", sys.executable)
    spare.proc.stdin.close()  # the node left without a job for it
    assert spare.proc.wait(30) == 0
    assert "Traceback" not in (tmp_path / "crawler.log").read_text()
    spares = SpareCrawlers(tmp_path / "crawler.log")
    spares.prepare()
    pid = spares._spare.pid
    spares.close()
    assert spares._spare is None
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] in "ZX"


def test_in_the_background_the_next_site_starts_while_the_last_one_closes(tmp_path):
    rig = Rig(tmp_path, [pages_script(1), pages_script(1)], idle_exit_s=3)
    rig.seed("s1")
    rig.seed("s2")
    rig.agent.closer = Closer(background=True)
    second_started = threading.Event()
    seen: dict[str, object] = {}
    start = rig.agent.start_crawl

    def start_crawl(job, log_path):
        crawl = start(job, log_path)
        if job["site"] == "s1":
            close = crawl.close

            def slow_close(grace_s=0):  # the first crawl quits its browser only once the second has started
                seen["overlapped"] = second_started.wait(10)
                seen["s1 done before it closed"] = rig.site("s1").run_status
                close(grace_s)

            crawl.close = slow_close
        else:
            seen["s1 locked meanwhile"] = "s1" in rig.agent.profiles.held()
            second_started.set()
        return crawl

    rig.agent.start_crawl = start_crawl
    assert rig.agent.run() == 0
    assert seen == {
        "overlapped": True,
        "s1 done before it closed": RunStatus.COMPLETED,
        "s1 locked meanwhile": True,  # the first site's profile stays locked until its browser is gone
    }
    assert {rig.site(s).run_status for s in ("s1", "s2")} == {RunStatus.COMPLETED}
    assert rig.agent.profiles.held() == [] and rig.agent.closer._thread is None  # all closed before the node left
    assert [c[0] for c in rig.cleanups] == ["s1", "s2"]
