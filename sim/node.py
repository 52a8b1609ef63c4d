"""The simulator's node: the node protocol (`fleet.protocol`) driven by events on virtual time.

A `SimNode` makes every decision the real agent makes by calling the same
`fleet.protocol` functions, and writes with the same `fleet.record.ops` on the same
table, queue and result store; only its I/O differs. It is event-driven
instead of a blocking loop, so that 500 nodes cost no threads: a long poll is
a wake-up when a message arrives, a crawl is a timeline of progress reports
(`sim.workload`), a hang is a page that never ends, and a killed
crawler is seen at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet import protocol
from fleet import protocol as crawl_end  # how an attempt ends (CrawlEnd, settle) is part of the protocol
from fleet.errors import StaleWrite
from fleet.outputs import checkpoint as ck
from fleet.outputs.results import LOCAL_ROLE, result_key, staged_result_key, writer_id
from fleet.protocol import CrawlEnd, CrawlEndKind, FollowUp, MessageAction, NodeCard, NodeRules, Stop, Watch
from fleet.record import ops
from fleet.record.failures import Failure, FailureClass
from fleet.record.messages import BadMessage, SiteMessage
from fleet.record.state import NodeState, SiteRecord
from node.counts import AttemptCounter
from sim.engine import Engine
from sim.model import Crawl, VInstance
from sim.world import World

#: What EC2's instance metadata shows once a spot instance is to be reclaimed.
SPOT_NOTICE = {"action": "terminate"}
RESULT_HEAD_BYTES = 300  # a result document's fields besides its items (`node.result.result_body`)


def _json_list_bytes(items: int, item_bytes: int) -> int:
    """The bytes of a JSON list of `items` items of `item_bytes` each."""
    return 2 + items * (item_bytes + 1)


def _failed_end(failure: Failure) -> CrawlEnd:
    """How the agent ends an attempt whose crawler failed with `failure`: its process died (`crash`), or it reported
    the error with its class (`node.crawler`)."""
    if failure.cls is FailureClass.CRASH:
        return crawl_end.exited_end(1)
    return CrawlEnd(CrawlEndKind.ERROR, error=f"simulated failure: {failure.label}", failure=failure)


@dataclass
class SimNode:
    sim: World
    inst: VInstance
    dead: bool = False
    notice: object = None  # the spot interruption notice, once it arrived
    stop_after: Stop | None = None  # asked for by an attempt's end: take no more work
    sites_done: int = 0
    idle_since: float = 0.0
    card: NodeCard = field(default_factory=NodeCard)  # the node item: what it says, when it is due
    crawl: Crawl | None = None
    watch: Watch | None = None  # the running attempt's timers
    msg: SiteMessage | None = None  # the running attempt's message
    rec: SiteRecord | None = None  # the record as this node last wrote it
    parts: ck.ClaimParts | None = None  # the running attempt's checkpoint parts
    counter: AttemptCounter | None = None  # what the running attempt found (`node.counts`, as the agent counts)
    staged_items: int = 0  # items of the pages staged since the last save
    gen: int = 0  # wake-ups scheduled under an older generation are void
    waiting: bool = False

    # --- scheduling -------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        return self.sim.engine

    @property
    def rules(self) -> NodeRules:
        return self.sim.settings

    @property
    def writer(self) -> str:
        """Whose prefix of the bucket this node writes under: a simulated node has no IAM role."""
        return writer_id(LOCAL_ROLE, self.inst.id)

    def _wake(self, t: float, fn: Callable[[], None]) -> None:
        self.gen += 1
        gen = self.gen

        def go() -> None:
            if gen == self.gen and not self.dead:
                fn()

        self.engine.at(t, go)

    # --- life ---------------------------------------------------------------------------
    def boot(self) -> None:
        if self.dead:
            return
        self.inst.state = "running"
        self.sim.cloud.changed()
        if self.sim.node_table.get_run(self.sim.run_id) is None:
            return self._exit()
        self._node_item(self.card.moved(NodeState.IDLE))
        self.idle_since = self.engine.now
        self.poll()

    def _exit(self) -> None:
        self._node_item(self.card.moved(NodeState.EXITING))
        self.gen += 1
        self.sim.cloud.shutdown(self.inst.id)

    def spot_notice_arrives(self) -> None:
        if self.dead:
            return
        self.notice = SPOT_NOTICE
        if self.crawl is not None and not self.crawl.killed:
            self._wake(self.engine.now, self._step)  # the agent looks at the notice within a second
        elif self.waiting:
            self._wake(self.engine.now, self.poll)

    def woken_by_message(self) -> bool:
        if not self.waiting or self.dead:
            return False
        self.waiting = False
        self._wake(self.engine.now, self.poll)
        return True

    def polled_by_visible_message(self) -> bool:
        """A hidden message showed again while this node was in a long poll: it receives now (a long poll that
        started earlier gets it before this node's own next turn, as SQS gives it to one of the waiting polls)."""
        if not self.waiting or self.dead:
            return False
        self.gen += 1  # the long poll's end, scheduled, is void: this receive ends it
        self.poll()
        return True

    def poll(self) -> None:
        """One turn of the agent's main loop."""
        rules, now = self.rules, self.engine.now
        self.waiting = False
        if protocol.before_receive(self.stop_after, self.notice, self.sites_done, rules):
            return self._exit()
        msg = self.sim.node_queue.receive(rules.receive_wait_s, rules.visibility_s)
        self._node_item()
        if msg is None:
            table, run_id = self.sim.node_table, self.sim.run_id
            queued = lambda: protocol.has_queued(table.open_stamps(run_id), lambda: table.has_held(run_id))  # noqa: E731
            if protocol.idle_stop(now - self.idle_since, rules, queued) or protocol.run_stop(
                self.sim.node_table.get_run(self.sim.run_id)
            ):
                return self._exit()
            if protocol.idle_restarts(now - self.idle_since, rules):
                self.idle_since = now  # as the agent: stayed for a QUEUED site
            # A long poll: back when a message arrives, or after the wait.
            self.waiting = True
            self.sim.waiters.append(self)
            self._wake(now + rules.receive_wait_s, self.poll)
            return
        handled = self._handle(msg)
        if handled is True:
            return  # an attempt started; its end calls poll again
        self._wake(now + handled, self.poll)  # at once, or after stepping back from a message left to others

    def _handle(self, msg: SiteMessage | BadMessage) -> bool | float:
        """The protocol's step for a received message, carried out; True when it claimed an attempt, else how long
        the node receives nothing (its step back)."""
        queue, key = self.sim.node_queue, protocol.record_of(msg)
        rec = self.sim.node_table.get_site(*key) if key else None
        step = protocol.on_message(msg, rec, self.sim.run_id, self.rules, self.inst.id)
        if step.action is MessageAction.CLAIM and isinstance(msg, SiteMessage) and rec is not None:
            try:
                rec = ops.claim(self.sim.node_table, rec, self.inst.id, self.sim.clock.now(), receipt=msg.receipt)
            except StaleWrite as e:
                step = protocol.on_claim_lost(e.current, msg.attempt)
            else:
                self._start(rec, msg)
                return True
        if step.action is MessageAction.DELETE:
            queue.delete(msg)
        elif step.visibility_s is not None:
            queue.set_visibility(msg, step.visibility_s)
            if step.action is MessageAction.HIDE:  # when it shows again, SQS hands it to a node in a long poll
                self.engine.at(self.engine.now + step.visibility_s, self.sim.message_visible)
        return step.step_back_s

    def _start(self, rec: SiteRecord, msg: SiteMessage) -> None:
        """The claimed attempt: skip it if its result is in S3 already, else start its crawler."""
        now = self.engine.now
        self.rec, self.msg, self.watch = rec, msg, Watch.start(self.rules, now)
        self._extend_visibility()
        key = result_key(rec.site, self.sim.run_date, rec.run_id)
        if self.sim.node_results.exists(key):
            try:
                self._write(ops.saved, self.sim.clock.now(), staged=0)
                self.sim.node_queue.delete(msg)
            except StaleWrite as f:
                self._settle(CrawlEnd(CrawlEndKind.FENCED, current=f.current))
                return
            self._after_attempt()
            return
        self._node_item(self.card.moved(NodeState.BUSY, rec))
        self.parts = self._claim_parts(rec)
        self.counter = AttemptCounter.resumed(ops.resumable(rec))
        self.crawl = self.sim.workload.attempt(self, rec, now)
        self._schedule()

    def _claim_parts(self, rec: SiteRecord) -> ck.ClaimParts:
        """This claim's parts; a resumed claim first reads the parts its checkpoint names, as the agent does."""
        claim = ck.ClaimParts((rec.site, self.sim.run_date, rec.run_id), rec.attempt, rec.version, self.writer)
        resume = ops.resumable(rec)
        if resume and not ck.is_legacy(resume):
            claim.earlier = ck.segments(resume)
            for key in claim.earlier_keys():
                self.sim.node_results.get(key)
            claim.saved_items = int(resume.get("items") or 0)
        return claim

    # --- the crawl ------------------------------------------------------------------------
    def _schedule(self) -> None:
        c, w = self.crawl, self.watch
        assert c is not None and w is not None
        wake = w.wake_at if not c.events else min(w.wake_at, c.events[0][0])
        self._wake(wake, self._step)

    def _step(self) -> None:
        c, now = self.crawl, self.engine.now
        assert c is not None and self.watch is not None
        try:
            if c.killed:
                return self._settle(crawl_end.exited_end(-9))
            while c.events and c.events[0][0] <= now:
                _, kind, payload = c.events.popleft()
                if kind == "result":
                    return self._settle(CrawlEnd(CrawlEndKind.RESULT))
                if kind == "failed":
                    return self._settle(_failed_end(payload))
                self._crawler_said(kind, payload, now)
            if self.watch.beat_due(now):
                self._beat_or_save(now)
            end = crawl_end.spot_end(self.notice) if self.notice else self.watch.timed_out(now)
            if end is not None:
                return self._settle(end)
        except StaleWrite as f:
            return self._settle(CrawlEnd(CrawlEndKind.FENCED, forced=True, current=f.current))
        self._schedule()

    def _crawler_said(self, kind: str, payload: Any, now: float) -> None:
        """A status step (written at once only when the hub times each step) or a checkpoint (a heartbeat too)."""
        assert self.watch is not None
        at = self.sim.clock.now()
        if kind == "status":
            status, url, pages = payload
            if self.counter is not None:
                self.counter.heard({"pages": pages})
            self.watch = self.watch.stepped(status, url, pages, at, now)
            if self.watch.writes_each_step:
                self._write(ops.report, status, at, url=url, pages=pages)
        elif kind == "checkpoint":  # the page's items staged; saved as a part and a checkpoint when due
            parts, p = self.parts, self.sim.params
            assert parts is not None
            parts.page(f"p{payload + 1}", payload, now)
            self.staged_items += p.items_per_page
            if self.counter is not None:
                self.counter.heard({"pages": payload})
                self.counter.saved(p.items_per_page)
            if parts.due(self.rules.save_every, now):
                self._save()

    def _save(self) -> None:
        """The staged pages' items as one part, then the checkpoint naming it (a heartbeat, too)."""
        parts, p, now = self.parts, self.sim.params, self.engine.now
        assert parts is not None and self.watch is not None
        self.sim.stats.checkpoints += 1
        if self.staged_items:
            self.sim.node_results.put_staged(parts.next_key(), bytes(_json_list_bytes(self.staged_items, p.item_bytes)))
        parts.stored(self.staged_items)
        self.staged_items = 0
        self.watch = self.watch.beaten(now)
        counts = self.counter.counts() if self.counter is not None else None
        self._write(ops.save_checkpoint, self.sim.clock.now(), self.watch.progress, parts.saved(), counts)

    def crawler_killed(self, site: str, attempt: int) -> None:
        c = self.crawl
        if c is not None and c.site == site and c.attempt == attempt and not c.killed:
            c.killed = True
            self._wake(self.engine.now, self._step)

    # --- settling -------------------------------------------------------------------------
    def _settle(self, end: CrawlEnd) -> None:
        """Carry out the protocol's settling of the ended attempt, then go back to the queue."""
        rec, msg = self.rec, self.msg
        assert rec is not None and msg is not None
        fenced, current = end.kind is CrawlEndKind.FENCED, end.current
        if not fenced:
            try:
                self._record_end(end, msg)
            except StaleWrite as e:
                fenced, current = True, e.current
        if fenced:  # the hub took the attempt over: it requeues (or has) with a new message
            self.sim.node_queue.delete(msg)
            self.stop_after = self.stop_after or protocol.stop_when_fenced(current, rec.attempt, self.inst.id)
        self.stop_after = self.stop_after or protocol.stop_after(end)
        if self.crawl is not None:
            outcome = "fenced" if fenced else "completed" if end.kind is CrawlEndKind.RESULT else str(end.kind)
            self.sim.stats.attempt_ended(self.inst.id, rec.site, rec.attempt, self.engine.now, outcome, self.crawl)
        self._after_attempt()

    def _record_end(self, end: CrawlEnd, msg: SiteMessage) -> None:
        """The result (after a last heartbeat: a zombie must not write one), or the attempt ended and followed up."""
        rec = self.rec
        assert rec is not None
        if end.kind is CrawlEndKind.RESULT:
            self._beat()
            claim = self.parts.claim if self.parts else rec.version
            staged = staged_result_key(self.writer, rec.site, self.sim.run_date, rec.run_id, rec.attempt, claim)
            items = self.parts.saved_items if self.parts else 0  # every page was checkpointed
            body = bytes(RESULT_HEAD_BYTES + _json_list_bytes(items, self.sim.params.item_bytes))
            self.sim.node_results.put_staged(staged, body)
            c = self.counter
            counts, pages = (c.counts(), c.pages) if c is not None else (None, None)
            self._write(ops.saved, self.sim.clock.now(), staged=claim, counts=counts, items=items, pages=pages)
            self.sim.node_queue.delete(msg)
            return
        if self.parts is not None and self.parts.staged_pages:  # the node ends it: what it holds is saved first
            self._save()
        claimed, args = rec.attempt, crawl_end.end_attempt_args(end, self.rules, self.sim.clock.now())
        counts = self.counter.counts() if self.counter is not None else None
        self._follow_up(end, claimed, self._write(ops.end_attempt, **args, counts=counts), msg)

    def _follow_up(self, end: CrawlEnd, attempt: int, new: SiteRecord, msg: SiteMessage) -> None:
        step = crawl_end.settle(end, attempt, new)
        if step.follow is FollowUp.RELEASE:
            self._write(ops.mark_enqueued)
            self.sim.node_queue.set_visibility(msg, step.release_after_s or 0.0)
            return
        if step.follow is FollowUp.REQUEUE:
            ops.send_next(self.sim.node_table, self.sim.node_queue, new)
        self.sim.node_queue.delete(msg)  # DEFER: the hub sends the next message when its backoff ends

    def _after_attempt(self) -> None:
        self.crawl, self.rec, self.msg, self.watch, self.parts, self.counter = None, None, None, None, None, None
        self.staged_items = 0
        self._node_item(self.card.moved(NodeState.IDLE))
        self.sites_done += 1
        self.idle_since = self.engine.now
        self._wake(self.engine.now, self.poll)

    # --- writes ---------------------------------------------------------------------------
    def _write(self, op: Callable[..., SiteRecord], *args: Any, **kw: Any) -> SiteRecord:
        """A fenced write of the attempt's record (StaleWrite: the hub moved it on)."""
        self.rec = op(self.sim.node_table, self.rec, *args, **kw)
        return self.rec

    def _beat_or_save(self, now: float) -> None:
        """A due heartbeat carries the staged pages' save when it would fall due before the next beat."""
        parts = self.parts
        if parts is not None and parts.due(self.rules.save_every, now + self.rules.heartbeat_interval_s):
            self._save()
            self._extend_visibility()
        else:
            self._beat()

    def _beat(self) -> None:
        """As the agent's: one write with the progress since the last; the node item is not written while busy."""
        assert self.watch is not None
        now = self.engine.now
        self.sim.stats.heartbeats += 1
        self.watch = self.watch.beaten(now)
        counts = self.counter.counts() if self.counter is not None else None
        self._write(ops.beat, self.sim.clock.now(), self.watch.progress, counts)
        self._extend_visibility()

    def _extend_visibility(self) -> None:
        now = self.engine.now
        if self.watch is not None and self.msg is not None and self.watch.hide_due(now):
            self.sim.node_queue.set_visibility(self.msg, self.rules.claimed_visibility_s)
            self.watch = self.watch.hidden(now)

    def _node_item(self, moved: NodeCard | None = None) -> None:
        """Write the node item when it is due: at once when `moved` changes what it says."""
        now = self.engine.now
        card = self.card = moved or self.card
        if card.due(now):
            self.sim.node_table.put_node(
                card.item(self.sim.run_id, self.inst.id, self.sim.clock.now(), self.inst.launched_at, self.sites_done)
            )
            self.card = card.written(now, self.rules)
