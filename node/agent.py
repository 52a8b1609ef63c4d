"""The node agent: receive -> claim -> one attempt (`node.attempt`) -> next or exit.

One loop, one thread, on real processes and real AWS. What to do at each step
is `fleet.protocol` (the simulator's nodes make the same decisions): this
module only carries them out. It takes messages until the protocol says stop
(a spot notice, sites_per_node, idleness, the run over, the hub declaring the
node lost, AWS failing too often, its Grid node gone), keeps its node item
fresh while idle, and counts each attempt for the hub's metrics.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from botocore.exceptions import ClientError

from fleet import protocol
from fleet.aws.clients import error_code, is_transient
from fleet.aws.metrics import CloudWatchSink, JobStats, node_heartbeat, node_job_data
from fleet.clock import Clock
from fleet.errors import StaleWrite, quote
from fleet.logs import event
from fleet.outputs.results import ResultStore
from fleet.protocol import CrawlEndKind, MessageAction, Stop, StopWhy
from fleet.record import ops
from fleet.record.codec import ERROR_MAX_CHARS, capped
from fleet.record.messages import BadMessage, SiteMessage, SiteQueue
from fleet.record.state import NodeState, SiteRecord
from fleet.record.table import StateTable
from node.attempt import Attempt
from node.closing import Closer
from node.evidence import Capture
from node.kit import AgentSettings, Cleanup, NodeKit, StartCrawl
from profiles import NO_MOUNTS, ProfileStore, SiteMounts

log = logging.getLogger("gridfleet.node")


#: How often a node sends its Heartbeat metric to CloudWatch (its table heartbeat is more frequent).
METRIC_BEAT_S = 60.0
#: How often a node whose Grid hub does not list it looks again, and for how long at most: long enough for the
#: watchdog to replace a lost hub (it passes every few minutes, and a hub boots in a few more).
GRID_WAIT_S, GRID_WAIT_MAX_S = 5.0, 1800.0

#: How much of a refused body the node's log line shows.
BODY_SHOWN = 64

_EXC_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Timeout))\b")


def error_type(kind: str, error: str | None) -> str:
    """The type of a failed job for metrics: the exception's class when the error names one, else the kind."""
    if kind == "error" and error:
        m = _EXC_NAME.match(error)
        if m:
            return m[1].rsplit(".", 1)[-1]
    return str(kind)


class Agent:
    def __init__(
        self,
        s: AgentSettings,
        *,
        table: StateTable,
        queue: SiteQueue,
        results: ResultStore,
        profiles: ProfileStore,
        start_crawl: StartCrawl,
        cleanup: Cleanup,
        clock: Clock,
        state_dir: Path,
        spot_notice: Callable[[], object] = lambda: None,
        healthy: Callable[[], str | None] = lambda: None,
        grid_up: Callable[[], bool] = lambda: True,
        metrics: CloudWatchSink | None = None,
        capture: Capture | None = None,
        prepare_crawl: Callable[[], None] = lambda: None,
        closer: Closer | None = None,
        mounts: SiteMounts = NO_MOUNTS,
    ):
        self.s = s
        self.table = table
        self.queue = queue
        self.results = results
        self.profiles = profiles
        self.mounts = mounts  # a site's own directory, mounted for its crawl by root's helper (AWS)
        self.start_crawl = start_crawl
        self.cleanup = cleanup
        self.prepare_crawl = prepare_crawl  # readies the next crawler process while this one's pages load
        self.closer = closer or Closer()  # closes a saved crawl's browser (in the background on a real node)
        self.clock = clock
        self.state_dir = state_dir
        self.spot_notice = spot_notice  # a truthy value once EC2 announced this spot instance's interruption
        self.capture = capture  # reads a Grid session's evidence before the cleanup ends it (None: none kept)
        self.healthy = healthy  # None when the node can crawl, else why not (e.g. its Grid node died)
        self.grid_up = grid_up  # False while the Grid hub does not answer or list this node (a hub lost, replaced)
        self.started_at = clock.now()
        self.sites_done = 0
        self.run_date = ""
        self._stop_after: Stop | None = None  # asked for by an attempt's end: finish it, take no more
        self._card = protocol.NodeCard()
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
        self.set_node(NodeState.IDLE)
        idle_since = self.clock.monotonic()
        failures = 0
        while True:
            stop = protocol.sick(self.healthy(), failures) or protocol.before_receive(
                self._stop_after, self.spot_notice(), self.sites_done, self.s
            )
            if stop is not None:
                return self._exit(stop)
            if not self.grid_up():  # its hub is lost: no site is taken until a hub's Grid lists this node again
                stop = self._wait_for_grid()
                if stop is not None:
                    return self._exit(stop)
                idle_since = self.clock.monotonic()
                continue
            try:
                msg = self.queue.receive(self.s.receive_wait_s, self.s.visibility_s)
                self._node_beat()
                worked = self.handle(msg) if msg is not None else False
                failures = 0
            except Exception as e:  # the outermost loop: AWS beyond botocore's retries is waited out, not fatal
                if not is_transient(e):
                    raise
                failures += 1
                event(
                    log,
                    "aws-error",
                    logging.WARNING,
                    run_id=self.s.run_id,
                    node=self.s.instance_id,
                    failures=failures,
                    error=f"{type(e).__name__}: {e}",
                )
                self.clock.sleep(min(30.0, 2.0**failures))
                idle_since = self.clock.monotonic()  # waiting out AWS is not being idle
                continue
            if msg is None:
                idle = self.clock.monotonic() - idle_since
                stop = protocol.idle_stop(idle, self.s, self._site_queued) or protocol.run_stop(
                    self.table.get_run(self.s.run_id)
                )
                if stop is not None:
                    return self._exit(stop)
                if protocol.idle_restarts(idle, self.s):
                    idle_since = self.clock.monotonic()  # stayed for a QUEUED site: its message is on its way
                continue
            if worked:
                self.sites_done += 1
                idle_since = self.clock.monotonic()

    def _wait_for_grid(self) -> Stop | None:
        """Wait (its node item fresh) while the Grid hub does not list this node: a lost hub is replaced by the
        watchdog, and this node's Grid node registers with the new one by itself (the run's Grid secret is the
        same). A stop when the run is over meanwhile, or after GRID_WAIT_MAX_S."""
        started = self.clock.monotonic()
        event(log, "grid-lost", logging.WARNING, run_id=self.s.run_id, node=self.s.instance_id)
        while not self.grid_up():
            waited = self.clock.monotonic() - started
            stop = protocol.run_stop(self.table.get_run(self.s.run_id))
            if stop is None and waited >= GRID_WAIT_MAX_S:
                stop = Stop(StopWhy.SICK, f"no Grid hub listed this node for {waited:.0f}s")
            if stop is not None:
                return stop
            self._node_beat()
            self.clock.sleep(GRID_WAIT_S)
        event(log, "grid-back", run_id=self.s.run_id, node=self.s.instance_id)
        return None

    def _site_queued(self) -> bool:
        run_id = self.s.run_id
        return protocol.has_queued(self.table.open_stamps(run_id), lambda: self.table.has_held(run_id))

    def _exit(self, stop: Stop) -> int:
        """Log why the node stops (a stop an attempt asked for was logged then), mark it exiting; the exit status."""
        self.closer.wait()  # the last crawl's browser closed and its lock released before the node says it leaves
        if stop is not self._stop_after:
            level = {StopWhy.SICK: logging.ERROR, StopWhy.SPOT: logging.WARNING}.get(stop.why, logging.INFO)
            event(log, "node-exit", level, run_id=self.s.run_id, node=self.s.instance_id, why=stop.detail)
        self.set_node(NodeState.EXITING)
        return 1 if stop.why is StopWhy.SICK else 0

    def handle(self, msg: SiteMessage | BadMessage) -> bool:
        """Deal with one message; True if it started an attempt."""
        key = protocol.record_of(msg)
        rec = None if key is None else self.table.get_site(*key)
        step = protocol.on_message(msg, rec, self.s.run_id, self.s, self.s.instance_id)
        if isinstance(msg, BadMessage) or step.action is not MessageAction.CLAIM:
            self._leave(msg, step)
            return False
        assert rec is not None
        claimed = self._claim(rec, msg)
        if claimed is None:
            return False
        try:
            stop = Attempt(self._kit(), claimed, msg).run()
        finally:
            self.set_node(NodeState.IDLE)
        self._stop_after = self._stop_after or stop
        return True

    def _kit(self) -> NodeKit:
        """What the attempt about to start works with of this node (made for each: the run's date is read at start)."""
        return NodeKit(
            s=self.s,
            run_date=self.run_date,
            clock=self.clock,
            table=self.table,
            queue=self.queue,
            results=self.results,
            profiles=self.profiles,
            state_dir=self.state_dir,
            start_crawl=self.start_crawl,
            prepare_crawl=self.prepare_crawl,
            cleanup=self.cleanup,
            closer=self.closer,
            capture=self.capture,
            spot_notice=self.spot_notice,
            busy=lambda rec: self.set_node(NodeState.BUSY, rec),
            job_ended=self.job_ended,
            grid_up=self.grid_up,
            metric_beat=self.metric_beat,
            mounts=self.mounts,
        )

    def _leave(self, msg: SiteMessage | BadMessage, step: protocol.MessageStep) -> None:
        """Carry out a message step that starts no attempt."""
        if step.refused:
            self._refused(msg, step)
        if step.action is MessageAction.DELETE:
            self.queue.delete(msg)
            if isinstance(msg, SiteMessage):
                event(log, "stale-message", logging.DEBUG, run_id=msg.run_id, site=msg.site, attempt=msg.attempt)
        elif step.visibility_s is not None:
            self.queue.set_visibility(msg, step.visibility_s)
        if step.step_back_s and isinstance(msg, SiteMessage):
            event(
                log,
                "left-to-others",
                run_id=msg.run_id,
                site=msg.site,
                attempt=msg.attempt,
                node=self.s.instance_id,
                receives=msg.receive_count,
                pause_s=step.step_back_s,
            )
            self.clock.sleep(step.step_back_s)

    def _refused(self, msg: SiteMessage | BadMessage, step: protocol.MessageStep) -> None:
        """One line for each receive of a message the node refuses, short whatever the message holds (anyone who may
        send to the queue wrote it): its values cut, its ids checked by `decode` already. A WARNING for one that
        ends in the DLQ; a message of another run, left to its nodes, is no fault of anyone's."""
        level = logging.WARNING if step.action is MessageAction.RELEASE else logging.INFO
        said = {"message_id": quote(msg.message_id, bare=True), "receives": msg.receive_count}
        if isinstance(msg, BadMessage):
            body = {"body": quote(msg.body[:BODY_SHOWN]), "chars": msg.size}
            event(log, "bad-message", level, node=self.s.instance_id, **said, problem=step.refused[:300], **body)
            return
        ids = {"run_id": msg.run_id, "site": msg.site, "attempt": msg.attempt}
        event(log, "refused-message", level, **ids, node=self.s.instance_id, **said, why=step.refused[:300])

    def _claim(self, rec: SiteRecord, msg: SiteMessage) -> SiteRecord | None:
        """The claimed record, or None when another node won the race or the record takes no more attempts."""
        try:
            rec = ops.claim(self.table, rec, self.s.instance_id, self.clock.now(), receipt=msg.receipt)
        except StaleWrite as e:  # another node claimed it first (a duplicate message)
            self._leave(msg, protocol.on_claim_lost(e.current, msg.attempt))
            return None
        except ClientError as e:  # the record cannot take another attempt: its message ends in the DLQ
            if error_code(e) != "ValidationException":
                raise
            event(
                log,
                "claim-refused",
                logging.ERROR,
                run_id=msg.run_id,
                site=msg.site,
                attempt=msg.attempt,
                node=self.s.instance_id,
                error=capped(e, ERROR_MAX_CHARS),
            )
            return None
        event(log, "claim", run_id=rec.run_id, site=rec.site, attempt=rec.attempt, node=self.s.instance_id)
        return rec

    # --- what an attempt reports back ------------------------------------------------------
    def job_ended(self, claimed_at: float, kind: CrawlEndKind | None, error: str | None = None) -> None:
        """Count the attempt claimed at `claimed_at` (monotonic) that just ended (kind None: it produced the site's
        result) and push it to CloudWatch."""
        seconds = self.clock.monotonic() - claimed_at
        failure = None if kind is None else error_type(kind, error)
        self.stats.job(seconds, failure)
        self.metrics.add(node_job_data(self.s.instance_id, seconds, failure))
        self.metrics.flush()

    # --- the node item and the node's metric -------------------------------------------------
    def set_node(self, state: NodeState, busy_with: SiteRecord | None = None) -> None:
        self._card = self._card.moved(state, busy_with)
        self._node_beat()

    def _node_beat(self) -> None:
        mono = self.clock.monotonic()
        if not self._card.due(mono):
            return
        item = self._card.item(
            self.s.run_id,
            self.s.instance_id,
            self.clock.now(),
            self.started_at,
            self.sites_done,
            stats=self.stats.to_plain(),
        )
        try:
            self.table.put_node(item)
        except Exception as e:  # the node item is a liveness hint: a missed one is made up by the next
            if not is_transient(e):
                raise
            return
        self._card = self._card.written(mono, self.s)
        self.metric_beat()

    def metric_beat(self) -> None:
        mono = self.clock.monotonic()
        if self.metrics.enabled and mono >= self._next_metric_beat:
            self.metrics.add(node_heartbeat(self.s.instance_id))
            self.metrics.flush()
            self._next_metric_beat = mono + METRIC_BEAT_S
