"""One attempt on a real node: skip check -> profile lock -> crawler process -> settle.

While the crawl runs the node waits on the crawler's events with a timeout that
wakes it for the next heartbeat (one fenced write of heartbeatEpoch and the
crawler's progress since the last one) and for its own watchdog (the first,
fastest rung of the kill ladder); when to do which is `fleet.protocol.Watch`.
The claimed message is hidden for hours once, not extended each beat: the hub
recovers claimed sites. Every write is fenced by the record the node last wrote:
if the hub moved the record on (a kill, a requeue), the next write fails, the
node stops its crawler and drops the attempt, and the hub owns what happens
next. The message is deleted only after the result is in S3 and COMPLETED is
written, or after the next attempt's message is sent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fleet import protocol
from fleet import protocol as crawl_end  # how an attempt ends (CrawlEnd, settle) is part of the protocol
from fleet.aws.clients import error_code, is_transient
from fleet.crawl import contract, crawlerfile
from fleet.errors import StaleWrite
from fleet.logs import event
from fleet.outputs.results import result_key, staged_quarantine_key, staged_result_key
from fleet.protocol import CrawlEnd, CrawlEndKind, FollowUp, Stop, Watch
from fleet.record import ops
from fleet.record.codec import ERROR_MAX_CHARS, URL_MAX_CHARS, capped
from fleet.record.failures import failure_of_event
from fleet.record.messages import SiteMessage
from fleet.record.state import Counts, SiteRecord, SiteStatus
from node import evidence, parts
from node.counts import AttemptCounter
from node.kit import NodeKit
from node.phases import phase_timings
from node.result import merged_items, result_body, result_counts
from node.runner import CrawlProcess, Exited
from profiles import HeldProfile, ProfileBusy, SiteMountFailed

log = logging.getLogger("gridfleet.node")

#: How long a crawler that reported its end may take to close its browser before it is killed.
QUIT_GRACE_S = 15.0


class Fenced(Exception):
    """The record moved past our attempt: someone else (the hub) owns the site now."""

    def __init__(self, current: SiteRecord | None):
        self.current = current


class Refused(Exception):
    """DynamoDB refused a write as invalid (e.g. an item over 400 KB): no retry can succeed, the attempt errs."""


class Attempt:
    """The attempt a claim just started, from the claim to its settling; `run()` returns a stop its end asks for."""

    def __init__(self, node: NodeKit, rec: SiteRecord, msg: SiteMessage):
        self.node, self.s = node, node.s
        self.rec, self.msg = rec, msg
        self.n = rec.attempt  # the claimed attempt (the record's count moves back when an attempt is given back)
        mono = node.clock.monotonic()
        self.marks: dict[str, float] = {"claim": mono}  # phase -> monotonic time, for the timings on the log line
        self.watch = Watch.start(node.s, mono)
        # the checkpoint this attempt starts from, its items read from the parts it names
        self.parts, self.resume = parts.load(node.results, rec, node.run_date, node.s.writer_id)
        self.items: list[dict[str, Any]] = list(self.resume.get("items") or []) if self.resume else []
        self.counter = AttemptCounter.resumed(self.resume)  # what this attempt found, for its attempt entry
        self.fields: dict[str, Any] = {"run_id": rec.run_id, "site": rec.site, "attempt": rec.attempt}
        self.fields["node"] = self.s.instance_id
        self.timed: dict[str, float] = {"ckpt_s": 0.0}  # seconds measured apart from the marks
        self.settled = False  # a result is settled while its crawler still closes the browser
        self.stop: Stop | None = None
        self.result_counts: Counts | None = None  # a quarantined result's counts, for the attempt it ends
        self.completed: dict[str, Any] | None = None  # the `completed` line's fields once the result is saved
        self.proc: CrawlProcess | None = None

    def run(self) -> Stop | None:
        self._extend_visibility()
        try:
            end = self._run()
        except Refused as r:  # the crawler (if any) is stopped and its browser ended by now
            end = crawl_end.refused_end(r)
        except Fenced as f:
            end = CrawlEnd(CrawlEndKind.FENCED, current=f.current)
        if end is not None and not self.settled:
            self.settled, self.stop = True, self._settle(end)
        return self.stop

    def _run(self) -> CrawlEnd | None:
        """Skip check, profile lock, crawl; how the attempt ended, or None when it is settled already."""
        node, rec = self.node, self.rec
        key = result_key(rec.site, node.run_date, rec.run_id)
        if node.results.exists(key):  # the hub made an earlier attempt's result the run's: SAVED with nothing staged
            items, pages = result_counts(node.results, key)
            self._write(ops.saved, node.clock.now(), staged=0, items=items, pages=pages)
            node.job_ended(self.marks["claim"], None, None)
            node.queue.delete(self.msg)
            event(log, "skip", **self.fields, why="result already in S3", key=key)
            return None
        node.busy(rec)
        self.marks["checked"] = node.clock.monotonic()
        try:  # the site's own directory, where its profile store looks (AWS: root mounts it for this claim)
            node.mounts.mount(rec.site)
        except SiteMountFailed as e:  # EFS or the node's helper, not the site: given back, tried again later
            return CrawlEnd(CrawlEndKind.BUSY, error=capped(e, ERROR_MAX_CHARS))
        try:
            on_wait, mono, sleep = self._beat_quietly, node.clock.monotonic, node.clock.sleep
            held = node.profiles.acquire(rec.site, self.s.lock_timeout_s, on_wait=on_wait, monotonic=mono, sleep=sleep)
        except ProfileBusy:  # a node cut off mid-crawl may still hold it: not the site's fault, try again later
            node.mounts.unmount(rec.site)
            return crawl_end.busy_end(rec.site, self.s.lock_timeout_s)
        except BaseException:
            node.mounts.unmount(rec.site)
            raise
        self.marks["locked"] = node.clock.monotonic()
        if held.removed:
            event(log, "stale-profile", run_id=rec.run_id, site=rec.site, removed=",".join(held.removed))
        session: list[str | None] = [None]
        end: CrawlEnd | None = None
        try:
            end = self._crawl(held.path, session)
        finally:
            close = partial(self._close, held, session[0], end or CrawlEnd(CrawlEndKind.FENCED, forced=True))
            if self.completed is not None:  # the result is saved and COMPLETED: nothing of the site is left to kill
                crawlerfile.remove(node.state_dir)
                if node.closer.background:  # the crawler quits its browser while the node may take its next site
                    self._handed()
                node.closer.run(close)
            else:
                close()
        return None if self.settled else end

    def _close(self, held: HeldProfile, session_id: str | None, end: CrawlEnd) -> None:
        """The crawler gone (killed unless it reported its end), evidence read, the browser ended, the lock released."""
        node = self.node
        if self.proc is not None:
            self.proc.close(QUIT_GRACE_S if not end.forced else 0)
            self._evidence(end, session_id)  # the crawler is gone (its kill never waits), its browser not yet
        self.marks["closed"] = node.clock.monotonic()
        node.cleanup(held.path, session_id, end.forced)
        held.release()
        node.mounts.unmount(self.rec.site)  # once the lock's descriptor is closed and the crawl's processes are gone
        if self.completed is None:
            crawlerfile.remove(node.state_dir)
        self.marks["free"] = node.clock.monotonic()
        if "handed" in self.marks:  # closed in the background: its own line
            event(log, "closed", **self.fields, **phase_timings(self.marks, None, ("close_s", "release_s")))
        elif self.completed is not None:
            self._handed()

    def _handed(self) -> None:
        """The node could take its next site now: the `completed` line, with the phases so far."""
        self.marks["handed"] = self.node.clock.monotonic()
        event(log, "completed", **(self.completed or {}), **phase_timings(self.marks, self.timed))

    # --- the crawl ----------------------------------------------------------------------------
    def _crawl(self, profile: Path, session: list[str | None]) -> CrawlEnd:
        self.proc = self._spawn(profile)
        try:
            end = self._follow(self.proc, session)
            if end.kind is CrawlEndKind.RESULT:  # saved while the crawler quits its browser (it does so by itself)
                self.settled, self.stop = True, self._settle(end)
            else:  # the node ends it: the staged pages are saved at once, not after the evidence and the browser
                self._save_before_end()  # (with node watchdogs the hub's backup kill waits NODE_HANG_END_S)
        except Fenced as f:
            end = CrawlEnd(CrawlEndKind.FENCED, forced=True, current=f.current)
        return end

    def _evidence(self, end: CrawlEnd, session_id: str | None) -> None:
        """What the browser shows after an error, a hang or a kill, kept beside the result (bounded in time)."""
        node, p = self.node, self.watch.progress
        if node.capture is None or not session_id or end.kind not in evidence.EVIDENCE_ENDS:
            return
        meta = {**self.fields, "end": str(end.kind), "error": end.error, "captured_at": node.clock.now()}
        meta["last_reported_url"] = p.url if p else None
        where = (self.rec.site, node.run_date, self.rec.run_id, self.n, self.s.writer_id)
        try:
            ev, prefix = evidence.keep(node.capture, node.results, where, meta, session_id)
        except (ClientError, BotoCoreError, ValueError) as e:  # evidence is a help: the attempt settles without it
            event(log, "evidence-missed", logging.WARNING, **self.fields, error=capped(e, ERROR_MAX_CHARS))
            return
        event(log, "evidence", **self.fields, end=str(end.kind), answered=ev.answered, why=ev.why, key=prefix)

    def _spawn(self, profile: Path) -> CrawlProcess:
        rec, s = self.rec, self.s
        limits = {**dict(s.limits_table), "group": rec.spec.rate_limit, "per_s": rec.spec.per_s}
        pacing = {**dict(s.limits_table), "run_id": rec.run_id, "per_domain_s": rec.spec.per_domain_s}
        job = {
            "site": rec.site,
            "start_url": rec.spec.start_url,
            "crawler": rec.spec.crawler,
            "options": dict(rec.spec.options),
            "attempt": rec.attempt,
            "node_id": s.instance_id,
            "grid_url": s.grid_url,
            "grid_secret_file": s.grid_secret_file,  # a path: the secret itself never travels in a job
            "profile_dir": str(profile),
            "chromium": s.chromium,
            "chrome_args": list(s.chrome_args),
            "page_load_timeout_s": s.page_load_timeout_s,
            "user_agent": s.user_agent,
            "robots": rec.spec.robots,
            "blocked_markers": list(rec.spec.blocked_markers),
            "checkpoint": dict(self.resume) if self.resume else None,
            "mark": list(rec.mark) if rec.spec.incremental and rec.mark else None,
            "rate_limit": limits if rec.spec.rate_limit else None,
            "pacing": pacing if s.limits_table else None,
        }
        if self.resume:
            r = self.resume
            event(log, "resume", **self.fields, pages=r.get("pages"), items=len(self.items), next=r.get("next"))
        self.marks["spawn"] = self.node.clock.monotonic()
        proc = self.node.start_crawl(job, self.node.state_dir / "crawler.log")
        crawlerfile.write(self.node.state_dir, rec.site, rec.attempt, proc.pid)
        return proc

    def _follow(self, proc: CrawlProcess, session: list[str | None]) -> CrawlEnd:
        """Take the crawler's events until the attempt ends: by the crawler, a spot notice, or the watchdog."""
        clock = self.node.clock
        while True:
            mono = clock.monotonic()
            wake = min(self.watch.wake_at, mono + 1.0)  # a spot notice is looked for at least once a second
            ev = proc.next_event(max(0.0, wake - mono))
            mono = clock.monotonic()
            end = self._on_event(ev, session, mono)
            if end is not None:
                return end
            if self.watch.beat_due(mono):
                self.beat(save=True)
            notice = self.node.spot_notice()
            end = crawl_end.spot_end(notice) if notice else self.watch.timed_out(mono)
            if end is not None:
                proc.kill()
                return end

    def _on_event(self, ev: object, session: list[str | None], mono: float) -> CrawlEnd | None:
        if isinstance(ev, Exited):
            return crawl_end.exited_end(ev.code)
        if not isinstance(ev, dict):
            return None
        kind = ev.get("event")
        self.counter.heard(ev)
        if kind == "status":
            self.watch = self.watch.stepped(
                SiteStatus(ev["site_status"]), ev.get("url"), ev.get("pages"), self.node.clock.now(), mono
            )
            if self.watch.writes_each_step:
                self._report()
        elif kind == "checkpoint":
            self._checkpoint(ev)
            self.timed["ckpt_s"] += self.node.clock.monotonic() - mono
        elif kind == "session":
            session[0] = ev.get("id")
            self.marks["session"] = mono
            if isinstance(ev.get("request_s"), (int, float)):
                self.timed["request_s"] = float(ev["request_s"])
            self.node.prepare_crawl()
        elif kind == "robots-skipped":
            event(log, "robots-skipped", **self.fields, url=capped(str(ev.get("url")), URL_MAX_CHARS))
        elif kind == "result":
            self.marks["result"] = mono
            return CrawlEnd(CrawlEndKind.RESULT, result=ev)
        elif kind == "error":
            how = CrawlEndKind.ROBOTS if ev.get("kind") == "robots" else CrawlEndKind.ERROR
            said = capped(ev.get("message", "crawler error"), ERROR_MAX_CHARS)
            return CrawlEnd(how, error=said, failure=failure_of_event(ev.get("failure")))
        return None

    # --- settling -----------------------------------------------------------------------------
    def _settle(self, end: CrawlEnd) -> Stop | None:
        """Record the result, or end the attempt (requeue, give back, FAILED), or leave it to the hub (fenced). A
        result the table refuses ends the attempt as an error; an end it refuses too is left to the hub, which ends
        the attempt once its heartbeat stops. Returns the stop the end asks for."""
        if end.kind is CrawlEndKind.ERROR and not self.node.grid_up():  # its hub lost: no fault of the site's
            end = crawl_end.grid_lost_end(end)
        stop = protocol.stop_after(end)
        claimed_at = self.marks["claim"]
        try:
            if end.kind is CrawlEndKind.RESULT:
                try:
                    broke = self._save_result(end)
                    if broke is None:
                        return stop
                    end = broke  # quarantined: the attempt ends, and with it the site
                except Refused as r:
                    end = crawl_end.refused_end(r)
            self.node.job_ended(claimed_at, end.kind, end.error)
            if end.kind is CrawlEndKind.FENCED:
                raise Fenced(end.current)
            args = crawl_end.end_attempt_args(end, self.s, self.node.clock.now())
            self.counter.told(log, self.fields)
            new = self._write(ops.end_attempt, **args, counts=self.result_counts or self.counter.counts())
            self._follow_up(end, new)
        except Fenced as f:
            if end.kind is CrawlEndKind.RESULT:  # a zombie's result, never written
                self.node.job_ended(claimed_at, CrawlEndKind.FENCED, None)
            dropped = self._dropped(f.current)
            return stop or dropped
        except Refused as r:
            event(log, "write-refused", logging.ERROR, **self.fields, error=capped(r, ERROR_MAX_CHARS))
        return stop

    def _follow_up(self, end: CrawlEnd, new: SiteRecord) -> None:
        step = crawl_end.settle(end, self.n, new)
        reason, queue = end.kind.reason, self.node.queue
        if step.follow is FollowUp.RELEASE:
            self._write(ops.mark_enqueued)  # the released message is the next attempt's message
            queue.set_visibility(self.msg, step.release_after_s or 0.0)
            event(
                log, f"{reason}-release", logging.WARNING, **self.fields, given_back=new.spot_requeues, error=end.error
            )
            return
        if step.follow is FollowUp.REQUEUE:
            ops.send_next(self.node.table, queue, new)
            nxt = new.attempt + 1
            event(log, "requeue", logging.WARNING, **self.fields, reason=reason, error=end.error, next_attempt=nxt)
        elif step.follow is FollowUp.DEFER:
            event(
                log,
                "retry-later",
                logging.WARNING,
                **self.fields,
                reason=reason,
                failure=new.failure_class,
                http_status=new.http_status,
                error=end.error,
                retry_at=new.retry_at,
                avoid=new.avoid_instance,
            )
        else:
            event(log, "failed", logging.WARNING, **self.fields, reason=reason, error=end.error)
        queue.delete(self.msg)

    def _dropped(self, cur: SiteRecord | None) -> Stop | None:
        """The hub took the attempt over: drop its message (the hub requeues, or has, with a new one)."""
        now = f"{cur.run_status}/{cur.fence()}" if cur else "moved on"
        event(log, "fenced", logging.WARNING, **self.fields, now=now, kill_reason=cur.kill_reason if cur else None)
        self.node.queue.delete(self.msg)
        stop = protocol.stop_when_fenced(cur, self.n, self.s.instance_id)
        if stop is not None:
            event(log, "node-exit", logging.WARNING, **self.fields, why=stop.detail)
        return stop

    def _save_result(self, end: CrawlEnd) -> CrawlEnd | None:
        """The result staged under the node's own prefix, then SAVED (the hub makes it the site's result), then the
        message deleted (and an incremental site's mark moved). A result that breaks the site's data contract goes
        to quarantine instead: the end that says so is returned."""
        node, rec = self.node, self.rec
        self.marks["save"] = node.clock.monotonic()
        self.beat()  # still ours? (a zombie must not write a result)
        key = result_key(rec.site, node.run_date, rec.run_id)
        claim = self.parts.claim.claim
        staged = staged_result_key(self.s.writer_id, rec.site, node.run_date, rec.run_id, self.n, claim)
        items = merged_items(self.items, (end.result or {}).get("items", []))
        body = result_body(rec, self.s.instance_id, node.clock.now(), {**(end.result or {}), "items": items})
        resumed = len(self.resume.get("items") or []) if self.resume else 0
        counts = self.counter.counts(items=len(items) - resumed)  # what this attempt added to its checkpoint's
        if rules := contract.broken(items, self.counter.pages, rec.spec.expect, rec.spec.baseline_items):
            self.result_counts = counts
            return self._quarantine(body, rules)
        wrote = node.results.put_staged(staged, body)  # False: this claim staged it already (a save missed after)
        now = node.clock.now()
        self._write(ops.saved, now, staged=claim, counts=counts, items=len(items), pages=self.counter.pages)
        node.job_ended(self.marks["claim"], None, None)
        node.queue.delete(self.msg)
        self.marks["saved"] = node.clock.monotonic()
        if rec.spec.incremental:
            self._new_mark(items)
        fields: dict[str, Any] = {**self.fields, "pages": (end.result or {}).get("pages"), "items": len(items)}
        fields.update(collisions=counts.collisions, skipped=counts.skipped, key=key, staged=staged)
        self.counter.told(log, self.fields)
        if self.resume:
            fields["resumed_at_page"] = self.resume.get("pages")
        if not wrote:
            fields["note"] = "staged already by this claim; kept"
        self.completed = fields
        return None

    def _quarantine(self, body: bytes, rules: list[str]) -> CrawlEnd:
        """Keep a result that broke the contract in quarantine (under the node's prefix: the hub copies it beside the
        result when it exports), never as the result; the end of the attempt."""
        rec, node = self.rec, self.node
        where = staged_quarantine_key(self.s.writer_id, rec.site, node.run_date, rec.run_id, self.n)
        wrote = node.results.put_staged(where, body)  # an earlier one of the same attempt number stays
        event(log, "contract-broken", logging.WARNING, **self.fields, key=where, kept=wrote, rules=" | ".join(rules))
        return CrawlEnd(CrawlEndKind.CONTRACT, error=capped(contract.summary(rules), ERROR_MAX_CHARS))

    def _new_mark(self, items: list[dict[str, Any]]) -> None:
        """An incremental site's high-water mark moves to the newest items this crawl found (none: unchanged)."""
        rec = self.rec
        mark = ops.next_mark(rec.mark, [str(i["id"]) for i in items if i.get("id") is not None])
        if mark is not None:  # if missed, the next run fetches these items again: more work, nothing lost
            self._missable("mark-missed", self.node.table.put_mark, rec.site, mark, rec.run_id, self.node.clock.now())

    # --- writes while the attempt runs --------------------------------------------------------------
    def _write(self, op: Callable[..., SiteRecord], *args: Any, **kwargs: Any) -> SiteRecord:
        try:
            self.rec = op(self.node.table, self.rec, *args, **kwargs)
        except StaleWrite as e:
            raise Fenced(e.current) from None
        except ClientError as e:
            if error_code(e) != "ValidationException":
                raise
            raise Refused(f"{op.__name__}: {e}") from None
        return self.rec

    def _missable(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """A write a later one makes up for: an AWS error past botocore's retries is logged as `what` (False)."""
        try:
            fn(*args, **kwargs)
            return True
        except Exception as e:
            if not is_transient(e):
                raise
            node = self.s.instance_id
            event(log, what, logging.WARNING, site=self.rec.site, node=node, error=f"{type(e).__name__}: {e}")
            return False

    def _checkpoint(self, ev: dict[str, Any]) -> None:
        """Keep the page's items and stage them with its cursor; once the staged pages are due (`run.checkpoint_pages`
        pages, or `run.checkpoint_s` since the first of them), save them."""
        new = [i for i in ev.get("items") or [] if isinstance(i, dict)]
        self.items.extend(new)
        self.counter.saved(len(new))
        self.parts.stage(new)
        mono = self.node.clock.monotonic()
        self.parts.claim.page(ev.get("next"), ev.get("pages"), mono)
        if self.parts.claim.due(self.s.save_every, mono) and self._store_staged():
            self._write_checkpoint()

    def _store_staged(self) -> bool:
        """Every staged item as one part; if missed (False), they stay staged for the next save, and the record's
        checkpoint is not written (it never names a part that is not there)."""
        try:
            return self.parts.store(self._put_part, self.node.results.get)
        except (ValueError, ClientError, BotoCoreError) as e:  # the slot holds what this claim cannot account for
            event(log, "part-missed", logging.WARNING, **self.fields, error=capped(e, ERROR_MAX_CHARS))
            return False

    def _put_part(self, key: str, body: bytes) -> bool | None:
        """One part, a new object under the node's prefix: True if written, False if there already, None if missed
        (logged as `part-missed`)."""
        wrote: list[bool] = []
        if self._missable("part-missed", lambda: wrote.append(self.node.results.put_staged(key, body))):
            return wrote[0]
        return None

    def _write_checkpoint(self) -> bool:
        """Write where the crawl got to, naming the part just stored: fenced, and a heartbeat too. If missed (False),
        the next save names every part this one did."""
        self.watch = self.watch.beaten(self.node.clock.monotonic())
        now, counts, ckpt = self.node.clock.now(), self.counter.counts(), self.parts.claim.saved()
        return self._missable(
            "checkpoint-missed", self._write, ops.save_checkpoint, now, self.watch.progress, ckpt, counts
        )

    def _save_before_end(self) -> None:
        """The node ends the attempt while it owns it: the staged pages are saved first, so that its retry repeats at
        most the page the crawl was on. Missable: the end is written whatever becomes of this save."""
        if not self.parts.claim.staged_pages:
            return
        try:
            if self._store_staged():
                self._write_checkpoint()
        except (ClientError, BotoCoreError, Refused) as e:
            event(log, "checkpoint-missed", logging.WARNING, **self.fields, error=capped(e, ERROR_MAX_CHARS))

    def _report(self) -> None:
        """Write the crawler's latest step now (without node watchdogs, where the hub times each step)."""
        p = self.watch.progress
        assert p is not None  # if missed (throttling), the next heartbeat carries the step
        self._missable("status-missed", self._write, ops.report, p.site_status, p.at, url=p.url, pages=p.pages)

    def beat(self, save: bool = False) -> None:
        """The attempt's heartbeat: one fenced write of heartbeatEpoch and the crawler's progress since the last.
        The node item is not written while busy (the hub watches a busy node through its site's heartbeat). With
        `save` (the crawl's own beat, never the result's "still ours?"), staged pages that would be due before the
        next beat are saved now, their checkpoint written with this beat: one write, not two."""
        mono = self.node.clock.monotonic()
        due = save and self.parts.claim.due(self.s.save_every, mono + self.s.heartbeat_interval_s)
        if due and self._store_staged():
            wrote = self._write_checkpoint()
        else:
            self.watch = self.watch.beaten(mono)
            # a missed heartbeat is made up by the next; a fenced one is not (Fenced propagates)
            now, counts = self.node.clock.now(), self.counter.counts()
            wrote = self._missable("heartbeat-missed", self._write, ops.beat, now, self.watch.progress, counts)
        if wrote:
            self._extend_visibility()
            self.node.metric_beat()

    def _extend_visibility(self) -> None:
        """Hide the claimed message for long once it could show again before the next beats."""
        mono = self.node.clock.monotonic()
        if not self.watch.hide_due(mono):
            return
        # if missed, the next heartbeat tries again (the message is hidden for visibility_s still)
        if self._missable("visibility-missed", self.node.queue.set_visibility, self.msg, self.s.claimed_visibility_s):
            self.watch = self.watch.hidden(mono)

    def _beat_quietly(self) -> None:
        """Heartbeat while waiting for the profile lock (at most once per interval)."""
        if self.watch.beat_due(self.node.clock.monotonic()):
            self.beat()
