"""Virtual time for whole fleets in one process: hubs and node agents as actors on one clock.

Each actor (a hub loop, a node agent, a chaos script) runs its real code on a
thread of its own, but only one runs at a time: whoever holds the baton. An
actor gives it up only in `clock.sleep()` (every wait in hub and node goes
through the clock), and the scheduler hands it to the actor that wakes
earliest, moving virtual time to that moment. Runs are deterministic and take
no wall time to wait. Crashing an actor (a SIGKILL, an instance gone) raises
`Crashed` in it at its next wake-up; `Crashed` is a BaseException, so the
`except Exception` of a loop that survives errors does not stop it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Crashed(BaseException):
    """Raised inside an actor that was crashed."""


@dataclass(eq=False)
class Actor:
    name: str
    fn: Callable[[], Any]
    crashed: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    thread: threading.Thread | None = field(default=None, repr=False)


class VirtualClock:
    def __init__(self, start: float = 1_800_000_000.0):
        self._now = start
        self._mono = 1_000.0
        self._cv = threading.Condition()
        self._turn: Actor | None = None  # who holds the baton (None: the scheduler)
        self._queue: list[tuple[float, int, Actor]] = []
        self._seq = itertools.count()
        self._local = threading.local()
        self.actors: list[Actor] = []
        self.steps = 0

    # --- the Clock protocol ---------------------------------------------------------
    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Waiting by another name: inside an actor it yields like sleep()."""
        self.sleep(seconds)

    def sleep(self, seconds: float) -> None:
        actor = getattr(self._local, "actor", None)
        if actor is None:  # the scheduler's own thread (set-up code): time simply moves on
            self._move_to(self._now + max(0.0, seconds))
            return
        with self._cv:
            self._push(self._now + max(0.0, seconds), actor)
            self._turn = None
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._turn is actor)
        if actor.crashed:
            raise Crashed(actor.name)

    # --- actors ---------------------------------------------------------------------
    def spawn(self, name: str, fn: Callable[[], Any], at: float | None = None) -> Actor:
        actor = Actor(name, fn)

        def body() -> None:
            self._local.actor = actor
            with self._cv:
                self._cv.wait_for(lambda: self._turn is actor)
            try:
                if not actor.crashed:
                    actor.result = fn()
            except Crashed:
                pass
            except BaseException as e:  # kept for the test to see; the scheduler goes on
                actor.error = e
            finally:
                actor.done = True
                with self._cv:
                    self._turn = None
                    self._cv.notify_all()

        actor.thread = threading.Thread(target=body, name=f"actor-{name}", daemon=True)
        self.actors.append(actor)
        with self._cv:
            self._push(self._now if at is None else max(at, self._now), actor)
        actor.thread.start()
        return actor

    def crash(self, actor: Actor) -> None:
        """It dies at its next wake-up, which is now: no more of its code runs past the wait it is in."""
        if actor.done or actor.crashed:
            return
        actor.crashed = True
        with self._cv:
            self._queue = [e for e in self._queue if e[2] is not actor]
            heapq.heapify(self._queue)
            self._push(self._now, actor)

    def stall(self, actor: Actor, seconds: float) -> None:
        """It runs nothing for `seconds` more (a stopped process, a network partition)."""
        with self._cv:
            for i, (wake, seq, a) in enumerate(self._queue):
                if a is actor:
                    self._queue[i] = (max(wake, self._now + seconds), seq, a)
            heapq.heapify(self._queue)

    def _push(self, wake: float, actor: Actor) -> None:
        heapq.heappush(self._queue, (wake, next(self._seq), actor))

    def _move_to(self, t: float) -> None:
        if t > self._now:
            self._mono += t - self._now
            self._now = t

    # --- the scheduler --------------------------------------------------------------
    def run(
        self, until: float | None = None, stop: Callable[[], bool] = lambda: False, max_steps: int = 2_000_000
    ) -> None:
        """Hand the baton around until `stop()`, time `until`, nobody left to run, or `max_steps`."""
        while self.steps < max_steps:
            with self._cv:
                self._cv.wait_for(lambda: self._turn is None)
                if stop() or not self._queue:
                    return
                wake, _, actor = self._queue[0]
                if until is not None and wake > until:
                    self._move_to(until)
                    return
                heapq.heappop(self._queue)
                if actor.done:
                    continue
                self._move_to(wake)
                self.steps += 1
                self._turn = actor
                self._cv.notify_all()
        raise RuntimeError(f"virtual time: more than {max_steps} steps")

    def shutdown(self) -> None:
        """Crash every actor still waiting, so no thread is left behind."""
        for actor in self.actors:
            self.crash(actor)
        self.run(max_steps=self.steps + 10 * len(self.actors) + 10)
