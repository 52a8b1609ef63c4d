"""Compute providers: where nodes come from. A small interface with an EC2 and a local implementation.

Launch and terminate are idempotent and report failures as data, so the next
plan sees them; `list` re-reads the truth (EC2 tags, or the local registry and
the process table) every time and never trusts memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hub.snapshot import Instance


@dataclass(frozen=True)
class LaunchResult:
    launched: tuple[str, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)


class ComputeProvider(Protocol):
    def list(self, run_id: str) -> list[Instance]:
        """Every instance tagged with the run, in any state the provider still reports."""

    def launch(self, run_id: str, count: int, target: int | None = None) -> LaunchResult:
        """Start up to `count` nodes; with `target`, re-read what runs and start only the difference."""

    def terminate(self, instance_ids: Sequence[str]) -> None: ...

    def hub_alive(self, hub_id: str) -> bool:
        """Whether the hub that holds a run (by the id it wrote on the run item) still runs."""
