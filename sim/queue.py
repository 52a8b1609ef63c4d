"""The one in-memory SQS queue: the simulator's, and the unit tests' (`sim.memory` takes it from here).

It keeps the semantics of SQS that gridfleet relies on: a received message is hidden for its visibility timeout
and its receive count goes up; a receipt handle names one receive, so a delete or a visibility change by an
older one does nothing; a message received `max_receive_count` times goes to the DLQ instead of its next
delivery. `fifo=True` is a FIFO queue as `SqsSiteQueue` uses one: a send whose deduplication id (that of its run,
site and attempt) was sent within the last `DEDUP_WINDOW_S` is accepted and dropped (counted in `deduplicated`,
not in `sent`), and while a message is in flight the later ones of its group (its site) wait. The contract suite
(tests/adapter) holds it to SQS on moto.

Sends, receives, deletes and visibility changes are O(log n), for the simulator's tens of thousands of
messages: the messages that can be received wait in a deque, the hidden ones on a heap by when they show again
(and join the deque then). Time is the monotonic time of the clock it is given, never slept on but for an empty
receive's long poll. The simulator's nodes do their long polls on its event heap instead: it makes the queue with
`long_poll=False` and an `on_send` that wakes them.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fleet.clock import Clock, SystemClock
from fleet.record.messages import (
    DEDUP_WINDOW_S,
    BadMessage,
    QueueDepth,
    SiteMessage,
    decode,
    dedup_id,
    encode,
    group_id,
)


@dataclass
class Message:
    """A message as the queue holds it."""

    id: str
    body: str
    visible_at: float = 0.0
    receives: int = 0
    receipt: str = ""
    group: str = ""  # FIFO: its message group


class MemoryQueue:
    """SQS semantics: visibility, receive counts, receipt handles, the DLQ; deduplication and groups on FIFO.

    `long_poll`: an empty receive waits out its `wait_s` on the clock, as SQS's long poll does (False: it returns
    at once and the caller does the waiting). `on_send` is called whenever a message becomes receivable by a send
    or a release (visibility 0): what wakes a caller's long poll."""

    def __init__(
        self,
        clock: Clock | None = None,
        max_receive_count: int = 10,
        *,
        fifo: bool = False,
        long_poll: bool = True,
        on_send: Callable[[], None] = lambda: None,
    ):
        self.clock: Clock = clock or SystemClock()
        self.max_receive_count = max_receive_count
        self.fifo = fifo
        self.long_poll = long_poll
        self.on_send = on_send
        self.dlq: list[Message] = []
        self.sent = 0
        self.deduplicated = 0
        self._msgs: dict[str, Message] = {}  # by id, in the order sent
        self._by_receipt: dict[str, str] = {}
        self._ready: deque[str] = deque()  # ids that may be receivable (a stale one is skipped when met)
        self._hidden: list[tuple[float, int, str]] = []  # (visible again at, seq, id)
        self._ids = itertools.count(1)
        self._groups: dict[str, deque[str]] = {}  # FIFO: each group's ids in order; only the first is ever ready
        self._dedup_at: dict[str, float] = {}  # FIFO: when each deduplication id was last sent

    @property
    def messages(self) -> list[Message]:
        """The messages in the queue (not the DLQ), in the order sent."""
        return list(self._msgs.values())

    # --- sending -----------------------------------------------------------------------------------------
    def _new(self, body: str, group: str = "", dedup: str | None = None) -> None:
        if dedup is not None:
            now = self.clock.monotonic()
            at = self._dedup_at.get(dedup)
            if at is not None and now - at < DEDUP_WINDOW_S:
                self.deduplicated += 1
                return
            self._dedup_at[dedup] = now
        m = Message(f"m{next(self._ids)}", body, group=group)
        self._msgs[m.id] = m
        if self.fifo:
            waiting = self._groups.setdefault(group, deque())
            waiting.append(m.id)
            if len(waiting) == 1:
                self._ready.append(m.id)
        else:
            self._ready.append(m.id)
        self.sent += 1
        self.on_send()

    def send(self, run_id: str, site: str, attempt: int, given_back: int = 0) -> None:
        body = encode(run_id, site, attempt)
        if self.fifo:
            self._new(body, group_id(run_id, site), dedup_id(run_id, site, attempt, given_back))
        else:
            self._new(body)

    def send_raw(self, body: str) -> None:
        """A body that need not be a site message; on FIFO its own group, deduplicated by its content."""
        if self.fifo:
            digest = hashlib.sha256(body.encode()).hexdigest()
            self._new(body, digest, digest)
        else:
            self._new(body)

    def send_many(self, items: Iterable[tuple[str, str, int]]) -> int:
        """Send each; the number sent (SQS takes them ten to a SendMessageBatch)."""
        n = 0
        for item in items:
            self.send(*item)
            n += 1
        return n

    # --- receiving ---------------------------------------------------------------------------------------
    def _release(self, now: float) -> None:
        while self._hidden and self._hidden[0][0] <= now:
            t, _, mid = heapq.heappop(self._hidden)
            m = self._msgs.get(mid)
            if m is not None and m.visible_at == t:
                self._ready.append(mid)

    def receive(self, wait_s: float, visibility_s: float) -> SiteMessage | BadMessage | None:
        now = self.clock.monotonic()
        self._release(now)
        while self._ready:
            mid = self._ready.popleft()
            m = self._msgs.get(mid)
            if m is None or m.visible_at > now:
                continue  # deleted, or made invisible again since it was queued here
            if m.receives >= self.max_receive_count:
                self._remove(m)
                self.dlq.append(m)
                continue
            m.receives += 1
            self._hide(m, now + visibility_s)
            m.receipt = f"{m.id}/{m.receives}"
            self._by_receipt[m.receipt] = m.id
            return decode(m.body, m.receipt, m.id, m.receives)
        if self.long_poll:
            self.clock.sleep(wait_s)  # a long poll that found nothing waits it out, as SQS does
        return None

    def _hide(self, m: Message, until: float) -> None:
        m.visible_at = until
        heapq.heappush(self._hidden, (until, next(self._ids), m.id))

    def _remove(self, m: Message) -> None:
        del self._msgs[m.id]
        if not self.fifo:
            return
        waiting = self._groups[m.group]
        first = waiting[0] == m.id  # (only the first of a group is ever received, so deleted)
        waiting.remove(m.id)
        if not waiting:
            del self._groups[m.group]
        elif first:
            self._ready.append(waiting[0])  # the group's next message may be received now
            self.on_send()

    def _received(self, receipt: str) -> Message | None:
        mid = self._by_receipt.get(receipt)
        m = self._msgs.get(mid) if mid is not None else None
        return m if m is not None and m.receipt == receipt else None

    def delete_receipt(self, receipt: str) -> None:
        m = self._received(receipt)
        self._by_receipt.pop(receipt, None)
        if m is not None:
            self._remove(m)

    def delete(self, msg: SiteMessage | BadMessage) -> None:
        self.delete_receipt(msg.receipt)

    def set_visibility(self, msg: SiteMessage | BadMessage, seconds: float) -> None:
        m = self._received(msg.receipt)
        if m is None:
            return
        now = self.clock.monotonic()
        if seconds <= 0:
            m.visible_at = now
            self._ready.append(m.id)
            self.on_send()
        else:
            self._hide(m, now + seconds)

    # --- looking -----------------------------------------------------------------------------------------
    def depth(self) -> QueueDepth:
        now = self.clock.monotonic()
        visible = sum(1 for m in self._msgs.values() if m.visible_at <= now)
        return QueueDepth(visible, len(self._msgs) - visible, len(self.dlq))

    def peek(self, limit: int = 100, dlq: bool = False) -> list[SiteMessage | BadMessage]:
        src = self.dlq if dlq else list(self._msgs.values())
        return [decode(m.body, m.receipt, m.id, m.receives) for m in src[:limit]]
