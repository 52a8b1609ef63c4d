"""The node agent: receive -> claim -> skip check -> lock profile -> crawl -> report -> next or exit.

One loop, one thread. While a crawl runs the agent waits on the crawler's
events with a timeout that wakes it for the next heartbeat (one fenced write of
heartbeatEpoch and the crawler's progress since the last one) and for its own
watchdog (the first, fastest rung of the kill ladder). The claimed message is
hidden for hours once, not extended each beat: the hub recovers claimed sites.
Every write is fenced by the record the agent last wrote: if the hub moved the
record on (a kill, a requeue), the next write fails, the agent stops its
crawler and drops the attempt, and the hub owns what happens next. The message is deleted only after the result is in
S3 and COMPLETED is written, or after the next attempt's message is sent.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from botocore.exceptions import ClientError

from fleet import crawlerfile, ops
from fleet.clock import Clock
from fleet.aws import error_code, is_transient
from fleet.codec import ERROR_MAX_CHARS, ITEM_ID_MAX_CHARS, NodeInfo, capped
from fleet.config import Config
from fleet.errors import StaleWrite
from fleet.logs import event
from fleet.metrics import CloudWatchSink, JobStats, node_heartbeat, node_job_data
from fleet.queue import BadMessage, SiteMessage, SiteQueue
from fleet.results import ResultStore, result_key
from fleet.state import Outcome, Reason, RunStatus, SiteRecord, SiteStatus
from fleet.table import StateTable
from node.runner import CrawlProcess, Exited
from profiles import ProfileBusy, ProfileStore

log = logging.getLogger("gridfleet.node")


@dataclass(frozen=True)
class AgentSettings:
    run_id: str
    instance_id: str
    max_attempts: int = 3
    spot_cap: int = 3
    hang_after_s: float = 120
    heartbeat_interval_s: float = 30
    visibility_s: float = 90
    idle_exit_s: float = 20
    sites_per_node: int = 0
    lock_timeout_s: float = 60
    browser_start_timeout_s: float = 120
    node_watchdog: bool = True
    receive_wait_s: float = 5
    grid_url: str = ""
    chromium: str = "/usr/bin/chromium"
    chrome_args: tuple[str, ...] = ()
    page_load_timeout_s: float = 600
    #: how a crawler reaches the state table for its rate-limit slots: {table, region, endpoint_url, local}
    limits_table: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_config(cls, c: Config, run_id: str, instance_id: str, grid_url: str, local: bool = False
                    ) -> AgentSettings:
        beat = max(0.5, c.run.heartbeat_timeout_s / 3)
        return cls(
            run_id=run_id, instance_id=instance_id, max_attempts=c.run.max_attempts,
            spot_cap=c.run.spot_requeue_cap, hang_after_s=c.run.hang_after_s, heartbeat_interval_s=beat,
            visibility_s=max(30.0, c.run.heartbeat_timeout_s), idle_exit_s=c.fleet.idle_exit_s,
            sites_per_node=c.fleet.sites_per_node, lock_timeout_s=c.run.lock_timeout_s,
            browser_start_timeout_s=c.run.browser_start_timeout_s, node_watchdog=c.fleet.node_watchdog,
            receive_wait_s=min(5.0, c.fleet.idle_exit_s), grid_url=grid_url, chromium=c.browser.chromium,
            chrome_args=c.browser.extra_args, page_load_timeout_s=c.browser.page_load_timeout_s,
            limits_table=(("table", c.aws.table), ("region", c.aws.region), ("endpoint_url", c.aws.endpoint_url),
                          ("local", local)),
        )


def merged_items(before: list[dict[str, Any]], now: list[Any]) -> list[dict[str, Any]]:
    """The checkpoint's items (earlier attempts and this one), then the crawler's result, each item once (by id,
    else by content): a resumed crawl's result has no duplicates.

    Ids are compared as the checkpoint stores them (cut to ITEM_ID_MAX_CHARS), so an item with a longer id that
    a resumed crawl finds again is still one item; it keeps its whole id when the crawler reported it whole."""
    out: dict[str, dict[str, Any]] = {}
    for item in [*before, *now]:
        if not isinstance(item, dict):
            item = {"value": item}
        if item.get("id") is None:
            key = json.dumps(item, sort_keys=True, default=str)
        else:
            key = capped(item["id"], ITEM_ID_MAX_CHARS)
        held = out.get(key)
        if held is None or len(str(held.get("id"))) < len(str(item.get("id"))):
            out[key] = item
    return list(out.values())


class Fenced(Exception):
    """The record moved past our attempt: someone else (the hub) owns the site now."""

    def __init__(self, current: SiteRecord | None):
        self.current = current


class Refused(Exception):
    """DynamoDB refused a write of the attempt as invalid (ValidationException, e.g. an item over 400 KB). No
    retry of that write can succeed: the attempt ends as an error, and the node goes on to its next site."""


def _refused_end(r: Refused) -> CrawlEnd:
    return CrawlEnd("error", error=f"the table refused a write of this attempt: {r}", forced=True)


@dataclass
class CrawlEnd:
    kind: str  # result | hang | error | fenced | spot | busy
    result: dict[str, Any] | None = None
    error: str | None = None
    kill_path: str | None = None
    forced: bool = False  # the crawler was killed: its browser and Grid session must be ended for it
    current: SiteRecord | None = None  # fenced: the record as the hub left it


def declared_lost(rec: SiteRecord, attempt: int, instance_id: str) -> bool:
    """Whether the hub ended (or is ending) `attempt` on `instance_id` because it took the node for dead."""
    if rec.kill_reason == str(Reason.LOST) and rec.instance_id == instance_id:
        return True
    return any(a.n == attempt and a.instance_id == instance_id and a.outcome == str(Reason.LOST)
               for a in rec.attempts)


def run_has_queued(table: StateTable, run_id: str) -> bool:
    """Whether a site of the run waits for a node. Its message can be out of sight for a while (taken by a long
    poll that died with its node, released later after a busy profile, being resent): an idle node stays for it
    rather than leave and have the hub launch another in its place."""
    return any(stamp[2] == str(RunStatus.QUEUED) for stamp in table.open_stamps(run_id).values())


StartCrawl = Callable[[dict[str, Any], Path], CrawlProcess]
Cleanup = Callable[[Path, "str | None", bool], None]  # (profile, Grid session id, forced)

#: AWS errors in a row (after botocore's retries) after which the node gives up and exits.
MAX_AWS_FAILURES = 10

#: How long a claimed site's message stays hidden. The hub owns a claimed site's recovery (it ends a dead or
#: killed attempt and deletes this message by its receipt), so the message only has to stay out of other nodes'
#: way: set once after the claim (SQS's maximum), extended by a heartbeat only when a crawl nears it.
CLAIMED_VISIBILITY_S = 12 * 3600.0

#: How often a node sends its Heartbeat metric to CloudWatch (its table heartbeat is more frequent).
METRIC_BEAT_S = 60.0

_EXC_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Timeout))\b")


def error_type(kind: str, error: str | None) -> str:
    """The type of a failed job for metrics: the exception's class when the error names one, else the kind."""
    if kind == "error" and error:
        m = _EXC_NAME.match(error)
        if m:
            return m[1].rsplit(".", 1)[-1]
    return kind


#: A site whose profile was locked elsewhere is offered again after this long.
BUSY_RETRY_S = 30.0

#: How long a crawler that reported its end may take to close its browser before it is killed.
QUIT_GRACE_S = 15.0


class Agent:
    def __init__(self, s: AgentSettings, *, table: StateTable, queue: SiteQueue, results: ResultStore,
                 profiles: ProfileStore, start_crawl: StartCrawl, cleanup: Cleanup, clock: Clock,
                 state_dir: Path, spot_notice: Callable[[], object] = lambda: None,
                 healthy: Callable[[], str | None] = lambda: None, metrics: CloudWatchSink | None = None):
        self.s = s
        self.table = table
        self.queue = queue
        self.results = results
        self.profiles = profiles
        self.start_crawl = start_crawl
        self.cleanup = cleanup
        self.clock = clock
        self.state_dir = state_dir
        self.spot_notice = spot_notice  # a truthy value once EC2 announced this spot instance's interruption
        self._stopping = False  # after a spot notice: finish the current message, take no more
        self.healthy = healthy  # None when the node can crawl, else why not (e.g. its Grid node died)
        self.started_at = clock.now()
        self.sites_done = 0
        self.run_date = ""
        self._node_state = "booting"
        self._next_node_beat = 0.0
        self._next_beat = 0.0  # the attempt's heartbeat (site record), while one runs
        self._hidden_until = 0.0  # monotonic: when the current message would become visible again
        self._progress: ops.Progress | None = None  # the crawler's latest step
        self._resume: Mapping[str, Any] | None = None  # the checkpoint the current attempt started from
        self._items: list[dict[str, Any]] = []  # the items of every checkpoint of the site so far
        self._node_site: tuple[str | None, int | None] = (None, None)
        self._expire_at: int | None = None
        self._rec: SiteRecord | None = None
        self._msg: SiteMessage | None = None
        self._marks: dict[str, float] = {}  # phase -> monotonic time, for the timings on the log line
        self.stats = JobStats()  # pushed on the node item with each heartbeat (the hub serves it to Prometheus)
        self.metrics = metrics or CloudWatchSink(None, "")
        self._next_metric_beat = 0.0

    # --- the main loop --------------------------------------------------------------
    def run(self) -> int:
        run = self.table.get_run(self.s.run_id)
        if run is None:
            event(log, "no-run", logging.ERROR, run_id=self.s.run_id, node=self.s.instance_id)
            return 1
        self.run_date = run.run_date
        self._expire_at = run.expire_at
        self._set_node("idle")
        idle_since = self.clock.monotonic()
        failures = 0
        while True:
            sick = self.healthy() or (f"AWS failing for {failures} tries in a row" if failures >= MAX_AWS_FAILURES
                                      else None)
            if sick:
                event(log, "node-exit", logging.ERROR, run_id=self.s.run_id, node=self.s.instance_id, why=sick)
                self._set_node("exiting")
                return 1
            if self._stopping or self.spot_notice():
                notice = self.spot_notice()
                if notice:
                    event(log, "node-exit", logging.WARNING, run_id=self.s.run_id, node=self.s.instance_id,
                          why=f"spot interruption notice: {notice}")
                break
            if self.s.sites_per_node and self.sites_done >= self.s.sites_per_node:
                event(log, "node-exit", run_id=self.s.run_id, node=self.s.instance_id, why="sites_per_node reached")
                break
            try:
                msg = self.queue.receive(self.s.receive_wait_s, self.s.visibility_s)
                self._node_beat()
                worked = self.handle(msg) if msg is not None else False
                failures = 0
            except Exception as e:  # the outermost loop: AWS beyond botocore's retries is waited out, not fatal
                if not is_transient(e):
                    raise
                failures += 1
                event(log, "aws-error", logging.WARNING, run_id=self.s.run_id, node=self.s.instance_id,
                      failures=failures, error=f"{type(e).__name__}: {e}")
                self.clock.sleep(min(30.0, 2.0 ** failures))
                idle_since = self.clock.monotonic()  # waiting out AWS is not being idle
                continue
            if msg is None:
                idle = self.clock.monotonic() - idle_since
                if idle >= self.s.idle_exit_s:
                    if not run_has_queued(self.table, self.s.run_id):
                        event(log, "node-exit", run_id=self.s.run_id, node=self.s.instance_id,
                              why=f"no work for {idle:.0f}s")
                        break
                    idle_since = self.clock.monotonic()  # a message is on its way: look again in idle_exit_s
                run = self.table.get_run(self.s.run_id)
                if run is None or run.finished:
                    event(log, "node-exit", run_id=self.s.run_id, node=self.s.instance_id, why="run finished")
                    break
                continue
            if worked:
                self.sites_done += 1
                idle_since = self.clock.monotonic()
        self._set_node("exiting")
        return 0

    def handle(self, msg: SiteMessage | BadMessage) -> bool:
        """Deal with one message; True if it started an attempt."""
        if isinstance(msg, BadMessage):
            event(log, "bad-message", logging.WARNING, node=self.s.instance_id, message_id=msg.message_id,
                  receives=msg.receive_count, problem=msg.problem)
            self.queue.set_visibility(msg, 1)  # it reaches the DLQ after max_receive_count receives
            return False
        rec = self.table.get_site(msg.run_id, msg.site)
        verdict = ops.classify(rec, msg.attempt)
        if verdict is ops.Verdict.STALE:
            self.queue.delete(msg)
            event(log, "stale-message", logging.DEBUG, run_id=msg.run_id, site=msg.site, attempt=msg.attempt)
            return False
        if verdict is ops.Verdict.WAIT or msg.run_id != self.s.run_id:
            self.queue.set_visibility(msg, min(self.s.visibility_s, 30))
            return False
        assert rec is not None
        try:
            rec = ops.claim(self.table, rec, self.s.instance_id, self.clock.now(), receipt=msg.receipt)
        except StaleWrite as e:  # another node claimed it first (a duplicate message)
            if ops.classify(e.current, msg.attempt) is ops.Verdict.STALE:
                self.queue.delete(msg)
            return False
        except ClientError as e:  # the record cannot take another attempt: its message ends in the DLQ
            if error_code(e) != "ValidationException":
                raise
            event(log, "claim-refused", logging.ERROR, run_id=msg.run_id, site=msg.site, attempt=msg.attempt,
                  node=self.s.instance_id, error=capped(e, ERROR_MAX_CHARS))
            return False
        event(log, "claim", run_id=rec.run_id, site=rec.site, attempt=rec.attempt, node=self.s.instance_id)
        self._marks = {"claim": self.clock.monotonic()}
        self._rec, self._msg, self._progress = rec, msg, None
        self._resume = ops.resumable(rec)
        self._items = list(self._resume.get("items") or []) if self._resume else []
        self._next_beat = self.clock.monotonic() + self.s.heartbeat_interval_s
        self._hidden_until = 0.0
        self._extend_visibility()
        try:
            self.attempt()
        finally:
            self._rec = self._msg = None
            self._set_node("idle")
        return True

    # --- one attempt ------------------------------------------------------------------
    def attempt(self) -> None:
        try:
            end = self._attempt()
        except Refused as r:  # the crawler (if any) is stopped and its browser ended by now
            end = _refused_end(r)
        if end is not None:
            self._finish(end)

    def _attempt(self) -> CrawlEnd | None:
        """Skip check, profile lock, crawl; how the attempt ended, or None when it is settled already."""
        rec, msg = self._rec, self._msg
        assert rec is not None and msg is not None
        key = result_key(rec.site, self.run_date, rec.run_id)
        if self.results.exists(key):
            self._write(ops.complete, key, self.clock.now(), skipped=True)
            self._job_ended(None)
            self.queue.delete(msg)
            event(log, "skip", run_id=rec.run_id, site=rec.site, attempt=rec.attempt, why="result already in S3",
                  key=key)
            return None
        self._set_node("busy", rec.site, rec.attempt)
        try:
            held = self.profiles.acquire(rec.site, self.s.lock_timeout_s, on_wait=self._beat_quietly,
                                         monotonic=self.clock.monotonic, sleep=self.clock.sleep)
        except ProfileBusy:  # a node cut off mid-crawl may still hold it: not the site's fault, try again later
            self._give_back(CrawlEnd("busy", error=f"profile lock of {rec.site} held elsewhere for "
                                                   f"{self.s.lock_timeout_s:.0f}s"), Reason.BUSY)
            return None
        except Fenced:
            return CrawlEnd("fenced")
        if held.removed:
            event(log, "stale-profile", run_id=rec.run_id, site=rec.site, removed=",".join(held.removed))
        session: list[str | None] = [None]
        end: CrawlEnd | None = None
        try:
            end = self._crawl(held.path, session)
        finally:
            self._marks["closed"] = self.clock.monotonic()
            self.cleanup(held.path, session[0], end.forced if end else True)
            held.release()
            crawlerfile.remove(self.state_dir)
        return end

    def _crawl(self, profile: Path, session: list[str | None]) -> CrawlEnd:
        rec = self._rec
        assert rec is not None
        job = {
            "site": rec.site, "start_url": rec.spec.start_url, "crawler": rec.spec.crawler,
            "options": dict(rec.spec.options), "attempt": rec.attempt, "node_id": self.s.instance_id,
            "grid_url": self.s.grid_url, "profile_dir": str(profile), "chromium": self.s.chromium,
            "chrome_args": list(self.s.chrome_args), "page_load_timeout_s": self.s.page_load_timeout_s,
            "checkpoint": dict(self._resume) if self._resume else None,
            "mark": list(rec.mark) if rec.spec.incremental and rec.mark else None,
            "rate_limit": ({**dict(self.s.limits_table), "group": rec.spec.rate_limit, "per_s": rec.spec.per_s}
                           if rec.spec.rate_limit else None),
        }
        if self._resume:
            event(log, "resume", run_id=rec.run_id, site=rec.site, attempt=rec.attempt, node=self.s.instance_id,
                  pages=self._resume.get("pages"), items=len(self._items), next=self._resume.get("next"))
        self._marks["spawn"] = self.clock.monotonic()
        proc = self.start_crawl(job, self.state_dir / "crawler.log")
        crawlerfile.write(self.state_dir, rec.site, rec.attempt, proc.pid)
        status, since = SiteStatus.PENDING, self.clock.monotonic()
        end = CrawlEnd("fenced", forced=True)
        try:
            while True:
                mono = self.clock.monotonic()
                watchdog_at = None
                if status is SiteStatus.URL_CALL and self.s.node_watchdog:
                    watchdog_at = since + self.s.hang_after_s
                elif status is SiteStatus.PENDING:
                    watchdog_at = since + self.s.browser_start_timeout_s
                next_beat = self._next_beat
                wake = min(next_beat, watchdog_at if watchdog_at is not None else next_beat, mono + 1.0)
                ev = proc.next_event(max(0.0, wake - mono))
                mono = self.clock.monotonic()
                if isinstance(ev, Exited):
                    how = f"killed by signal {-ev.code}" if ev.code < 0 else f"exit code {ev.code}"
                    end = CrawlEnd("error", error=f"crawler process ended without a result ({how})", forced=True)
                    return end
                if isinstance(ev, dict):
                    kind = ev.get("event")
                    if kind == "status":
                        new = SiteStatus(ev["site_status"])
                        self._progress = ops.Progress(new, self.clock.now(), ev.get("url"), ev.get("pages"))
                        if not self.s.node_watchdog:  # the hub is the hang detector: it needs each step at once
                            self._report()
                        # else the node ends hangs itself and the hub's check is the backup: the latest step goes
                        # with the next heartbeat (one write per interval, however many pages)
                        status, since = new, mono
                    elif kind == "checkpoint":
                        self._checkpoint(ev)
                    elif kind == "session":
                        session[0] = ev.get("id")
                        self._marks["session"] = mono
                    elif kind == "result":
                        self._marks["result"] = mono
                        end = CrawlEnd("result", result=ev)
                        return end
                    elif kind == "error":
                        end = CrawlEnd("error", error=capped(ev.get("message", "crawler error"), ERROR_MAX_CHARS))
                        return end
                if mono >= self._next_beat:
                    self._beat()
                notice = self.spot_notice()
                if notice:
                    proc.kill()
                    end = CrawlEnd("spot", error=f"spot interruption notice: {notice}", forced=True)
                    return end
                if watchdog_at is not None and mono >= watchdog_at:
                    proc.kill()
                    if status is SiteStatus.URL_CALL:
                        end = CrawlEnd("hang", error=f"no progress on {self._progress.url if self._progress else '?'} "
                                                     f"for {self.s.hang_after_s:.0f}s", kill_path="watchdog",
                                       forced=True)
                    else:
                        end = CrawlEnd("error", error=f"browser session did not start in "
                                                      f"{self.s.browser_start_timeout_s:.0f}s", kill_path="watchdog",
                                       forced=True)
                    return end
        except Fenced as f:
            end = CrawlEnd("fenced", forced=True, current=f.current)
            return end
        finally:
            # A crawler that reported its end closes its own browser; any other is killed now.
            proc.close(QUIT_GRACE_S if not end.forced else 0)

    def _finish(self, end: CrawlEnd) -> None:
        """Settle the attempt: record its result, or end it (requeue or FAILED), or leave it to the hub (fenced).
        A result the table refuses ends the attempt as an error; an end it refuses too is left to the hub, which
        ends the attempt once its heartbeat stops."""
        rec, msg = self._rec, self._msg
        assert rec is not None and msg is not None
        fields = dict(run_id=rec.run_id, site=rec.site, attempt=rec.attempt, node=self.s.instance_id)
        try:
            if end.kind == "result":
                try:
                    self._save_result(end, fields)
                    return
                except Refused as r:
                    end = _refused_end(r)
            if end.kind != "spot":  # a spot end is counted where it is given back
                self._job_ended(error_type(end.kind, end.error))
            if end.kind == "fenced":
                raise Fenced(end.current)
            if end.kind == "spot":
                self._give_back(end, Reason.SPOT)
                return
            reason = Reason.HANG if end.kind == "hang" else Reason.ERROR
            new = self._write(ops.end_attempt, outcome=Outcome(str(reason)), reason=reason, now=self.clock.now(),
                              max_attempts=self.s.max_attempts, spot_cap=self.s.spot_cap, kill_path=end.kill_path,
                              error=end.error)
            if new.run_status is RunStatus.QUEUED:
                ops.send_next(self.table, self.queue, new)
                event(log, "requeue", logging.WARNING, **fields, reason=reason, error=end.error,
                      next_attempt=new.attempt + 1)
            else:
                event(log, "failed", logging.WARNING, **fields, reason=reason, error=end.error)
            self.queue.delete(msg)
        except Fenced as f:
            if end.kind == "result":  # a zombie's result, never written
                self._job_ended(error_type("fenced", None))
            cur = f.current
            event(log, "fenced", logging.WARNING, **fields,
                  now=f"{cur.run_status}/{cur.fence()}" if cur else "moved on",
                  kill_reason=cur.kill_reason if cur else None)
            self.queue.delete(msg)  # the hub requeues (or has) with a new message
            if cur is not None and declared_lost(cur, rec.attempt, self.s.instance_id):
                # The hub thinks this node is dead and has terminated it (or is about to): take no more work.
                self._stopping = True
                event(log, "node-exit", logging.WARNING, **fields, why="the hub declared this node lost")
        except Refused as r:
            event(log, "write-refused", logging.ERROR, **fields, error=capped(r, ERROR_MAX_CHARS))

    def _save_result(self, end: CrawlEnd, fields: dict[str, Any]) -> None:
        """The result to S3, then COMPLETED, then the message deleted (and an incremental site's mark moved)."""
        rec, msg = self._rec, self._msg
        assert rec is not None and msg is not None
        self._beat()  # still ours? (a zombie must not write a result)
        key = result_key(rec.site, self.run_date, rec.run_id)
        items = merged_items(self._items, (end.result or {}).get("items", []))
        body = self._result_body({**(end.result or {}), "items": items})
        wrote = self.results.put_new(key, body)
        self._write(ops.complete, key, self.clock.now())
        self._job_ended(None)
        self.queue.delete(msg)
        if rec.spec.incremental and wrote:
            self._new_mark(items)
        event(log, "completed", **fields, pages=(end.result or {}).get("pages"), items=len(items), key=key,
              **self._timings(), **({"resumed_at_page": self._resume.get("pages")} if self._resume else {}),
              **({} if wrote else {"note": "result existed; kept"}))

    def _timings(self) -> dict[str, str]:
        """Seconds per phase: setup (claim to crawler start), browser (to session), crawl, close, save."""
        m, now = self._marks, self.clock.monotonic()
        spans = {"setup_s": ("claim", "spawn"), "browser_s": ("spawn", "session"), "crawl_s": ("session", "result"),
                 "close_s": ("result", "closed"), "save_s": ("closed", None)}
        return {k: f"{(m[b] if b else now) - m[a]:.2f}" for k, (a, b) in spans.items()
                if a in m and (b is None or b in m)}

    def _give_back(self, end: CrawlEnd, reason: Reason) -> None:
        """End the attempt without spending it (spot notice: this node stops; busy profile: try again later)
        and release the message: at once after a spot notice, after a while for a busy profile."""
        rec, msg = self._rec, self._msg
        assert rec is not None and msg is not None
        if reason is Reason.SPOT:
            self._stopping = True
        self._job_ended(str(reason))
        fields = dict(run_id=rec.run_id, site=rec.site, attempt=rec.attempt, node=self.s.instance_id)
        try:
            new = self._write(ops.end_attempt, outcome=Outcome(str(reason)), reason=reason, now=self.clock.now(),
                              max_attempts=self.s.max_attempts, spot_cap=self.s.spot_cap, error=end.error)
            if new.run_status is RunStatus.QUEUED and new.attempt < rec.attempt:
                self._write(ops.mark_enqueued)  # the released message is the next attempt's message
        except Fenced:
            self.queue.delete(msg)  # the hub took it over meanwhile
            return
        except Refused as r:  # the hub ends the attempt once its heartbeat stops (or resends the message)
            event(log, "write-refused", logging.ERROR, **fields, error=capped(r, ERROR_MAX_CHARS))
            return
        if new.run_status is RunStatus.QUEUED and new.attempt < rec.attempt:
            self.queue.set_visibility(msg, 0 if reason is Reason.SPOT else BUSY_RETRY_S)
            event(log, f"{reason}-release", logging.WARNING, **fields, given_back=new.spot_requeues,
                  error=end.error)
        elif new.run_status is RunStatus.QUEUED:  # over the spot cap: an ordinary requeue
            ops.send_next(self.table, self.queue, new)
            self.queue.delete(msg)
            event(log, "requeue", logging.WARNING, **fields, reason=reason, next_attempt=new.attempt + 1)
        else:
            self.queue.delete(msg)
            event(log, "failed", logging.WARNING, **fields, reason=reason)

    # --- metrics --------------------------------------------------------------------------
    def _job_ended(self, error: str | None) -> None:
        """Count the attempt that just ended (None: it produced the site's result) and push it to CloudWatch."""
        seconds = self.clock.monotonic() - self._marks.get("claim", self.clock.monotonic())
        self.stats.job(seconds, error)
        self.metrics.add(node_job_data(self.s.instance_id, seconds, error))
        self.metrics.flush()

    # --- writes -------------------------------------------------------------------------
    def _write(self, op: Callable[..., SiteRecord], *args: Any, **kwargs: Any) -> SiteRecord:
        assert self._rec is not None
        try:
            self._rec = op(self.table, self._rec, *args, **kwargs)
        except StaleWrite as e:
            raise Fenced(e.current) from None
        except ClientError as e:
            if error_code(e) != "ValidationException":
                raise
            raise Refused(f"{op.__name__}: {e}") from None
        return self._rec

    def _new_mark(self, items: list[dict[str, Any]]) -> None:
        """An incremental site's high-water mark moves to the newest items this crawl found (none: unchanged)."""
        rec = self._rec
        assert rec is not None
        mark = ops.next_mark(rec.mark, [str(i["id"]) for i in items if i.get("id") is not None])
        if mark is not None:  # if missed, the next run fetches these items again: more work, nothing lost
            self._missable("mark-missed", self.table.put_mark, rec.site, mark, rec.run_id, self.clock.now())

    def _checkpoint(self, ev: dict[str, Any]) -> None:
        """Keep the page's items and write where the crawl got to (a heartbeat, too)."""
        self._items.extend(i for i in ev.get("items") or [] if isinstance(i, dict))
        ckpt = {"next": ev.get("next"), "pages": ev.get("pages"), "items": self._items}
        self._next_beat = self.clock.monotonic() + self.s.heartbeat_interval_s
        # if missed, the next checkpoint carries everything this one had
        self._missable("checkpoint-missed", self._write, ops.save_checkpoint, self.clock.now(), self._progress, ckpt)

    def _report(self) -> None:
        """Write the crawler's latest step now (without node watchdogs, where the hub times each step)."""
        p = self._progress
        assert p is not None  # if missed (throttling), the next heartbeat carries the step
        self._missable("status-missed", self._write, ops.report, p.site_status, p.at, url=p.url, pages=p.pages)

    def _beat(self) -> None:
        """The attempt's heartbeat: one fenced write of heartbeatEpoch and the crawler's progress since the last.
        The node item is not written while busy (the hub watches a busy node through its site's heartbeat)."""
        self._next_beat = self.clock.monotonic() + self.s.heartbeat_interval_s
        # a missed heartbeat is made up by the next; a fenced one is not (Fenced propagates)
        if self._missable("heartbeat-missed", self._write, ops.beat, self.clock.now(), self._progress):
            self._extend_visibility()
            self._metric_beat()

    def _extend_visibility(self) -> None:
        """Hide the claimed message for CLAIMED_VISIBILITY_S once it could show again before the next beats."""
        mono = self.clock.monotonic()
        if self._msg is None or mono + 2 * self.s.heartbeat_interval_s < self._hidden_until:
            return
        # if missed, the next heartbeat tries again (the message is hidden for visibility_s still)
        if self._missable("visibility-missed", self.queue.set_visibility, self._msg, CLAIMED_VISIBILITY_S):
            self._hidden_until = mono + CLAIMED_VISIBILITY_S

    def _missable(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Make a write that a later one makes up for: an AWS error that outlasted botocore's retries is logged
        as `what` and the crawl goes on (False); anything else is raised."""
        try:
            fn(*args, **kwargs)
            return True
        except Exception as e:
            if not is_transient(e):
                raise
            site = self._rec.site if self._rec else None
            event(log, what, logging.WARNING, site=site, node=self.s.instance_id, error=f"{type(e).__name__}: {e}")
            return False

    def _beat_quietly(self) -> None:
        """Heartbeat while waiting for the profile lock (at most once per interval)."""
        if self.clock.monotonic() >= self._next_beat:
            self._beat()

    def _set_node(self, state: str, site: str | None = None, attempt: int | None = None) -> None:
        self._node_state = state
        self._node_site = (site, attempt)
        self._node_beat(force=True)

    def _node_beat(self, force: bool = False) -> None:
        mono = self.clock.monotonic()
        if not force and mono < self._next_node_beat:
            return
        site, attempt = self._node_site
        try:
            self.table.put_node(NodeInfo(self.s.run_id, self.s.instance_id, self._node_state, self.clock.now(),
                                         self.started_at, site, attempt, self.sites_done, self._expire_at,
                                         stats=self.stats.to_plain()))
        except Exception as e:  # the node item is a liveness hint: a missed one is made up by the next
            if not is_transient(e):
                raise
            return
        self._next_node_beat = mono + self.s.heartbeat_interval_s
        self._metric_beat()

    def _metric_beat(self) -> None:
        mono = self.clock.monotonic()
        if self.metrics.enabled and mono >= self._next_metric_beat:
            self.metrics.add(node_heartbeat(self.s.instance_id))
            self.metrics.flush()
            self._next_metric_beat = mono + METRIC_BEAT_S

    def _result_body(self, result: dict[str, Any]) -> bytes:
        rec = self._rec
        assert rec is not None
        attempt = rec.current_attempt
        body = {
            "run_id": rec.run_id, "site": rec.site, "attempt": rec.attempt, "instance_id": self.s.instance_id,
            "start_url": rec.spec.start_url, "started_at": attempt.start if attempt else None,
            "finished_at": self.clock.now(), "pages": result.get("pages", 0), "items": result.get("items", []),
        }
        return json.dumps(body, indent=1).encode()
