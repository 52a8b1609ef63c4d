"""Local "instances" for the embedded default: node agents started as detached processes.

Each instance runs exactly the node entrypoint that cloud-init runs on EC2
(`gridfleet node`, which starts its own Grid node and Chromium). The registry,
one `instance.json` per instance under `<stack>/instances/<run_id>/<id>/`, plays the part of
EC2's tags: a hub started again finds what an earlier hub launched. The process
table is the other half of the truth: a process marked with the run but missing
from the registry (a crash between spawn and write) is listed too, so it is
terminated rather than leaked.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from fleet import procs
from fleet.clock import Clock
from hub.providers.base import LaunchResult
from hub.snapshot import Instance

log = logging.getLogger("gridfleet.hub")

NodeCommand = Callable[[str, str, Path], list[str]]  # (run_id, instance_id, instance_dir) -> argv


class LocalProvider:
    def __init__(
        self,
        instances_dir: Path,
        stack_id: str,
        node_command: NodeCommand,
        clock: Clock,
        extra_env: dict[str, str] | None = None,
    ):
        self.dir = instances_dir
        self.stack_id = stack_id
        self.node_command = node_command
        self.clock = clock
        self.extra_env = extra_env or {}
        self._children: dict[str, object] = {}
        self._lock = threading.Lock()

    # --- registry -------------------------------------------------------------
    def instance_dir(self, instance_id: str, run_id: str | None = None) -> Path:
        """`<instances>/<run_id>/<instance_id>`; without the run, found by looking."""
        if run_id is not None:
            return self.dir / run_id / instance_id
        found = list(self.dir.glob(f"*/{instance_id}"))
        return found[0] if found else self.dir / "_unknown" / instance_id

    def _read(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _write(self, data: dict) -> None:
        d = self.instance_dir(data["id"], data["run_id"])
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "instance.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, d / "instance.json")

    def registry(self, run_id: str) -> list[dict]:
        d = self.dir / run_id
        if not d.is_dir():
            return []
        return [e for e in (self._read(p / "instance.json") for p in sorted(d.iterdir())) if e]

    # --- provider interface ---------------------------------------------------
    def list(self, run_id: str) -> list[Instance]:
        self._reap()
        running = {
            p.markers.get("GRIDFLEET_INSTANCE"): p
            for p in procs.find(procs.scan(), GRIDFLEET_RUN=run_id, GRIDFLEET_STACK=self.stack_id)
            if p.markers.get("GRIDFLEET_ROLE") == "node"
        }
        out: list[Instance] = []
        for e in self.registry(run_id):
            # Right after the spawn the child may not show its markers yet (until its exec), so the registry's
            # own pid and start time count as well.
            alive = e["id"] in running or (
                e.get("state") != "terminated"
                and e.get("pid") is not None
                and procs.pid_alive(int(e["pid"]), e.get("start_ticks"))
            )
            state = (
                "running" if alive else ("pending" if e.get("state") == "pending" and self._young(e) else "terminated")
            )
            if state == "terminated" and e.get("state") != "terminated":
                e["state"] = "terminated"
                e["terminated_at"] = self.clock.now()
                self._write(e)
            out.append(
                Instance(
                    e["id"],
                    state,
                    "node",
                    {"gridfleet:run_id": run_id, "gridfleet:role": "node"},
                    instance_type="local",
                )
            )
        known = {i.id for i in out}
        for iid in running:
            if iid and iid not in known:  # spawned, but the registry write was lost: list it so it is not leaked
                out.append(Instance(iid, "running", "node", {"gridfleet:run_id": run_id}, instance_type="local"))
        return out

    def _young(self, e: dict) -> bool:
        return self.clock.now() - float(e.get("launched_at", 0)) < 30

    def launch(self, run_id: str, count: int, target: int | None = None) -> LaunchResult:
        if target is not None:
            count = min(count, max(0, target - sum(1 for i in self.list(run_id) if i.live)))
        launched, errors = [], []
        for _ in range(count):
            iid = "i-local-" + secrets.token_hex(4)
            entry = {
                "id": iid,
                "run_id": run_id,
                "role": "node",
                "state": "pending",
                "launched_at": self.clock.now(),
                "pid": None,
            }
            self._write(entry)  # before the spawn: a crash after it leaves a "pending" entry, never a ghost
            d = self.instance_dir(iid, run_id)
            try:
                p = procs.spawn(
                    self.node_command(run_id, iid, d),
                    markers={
                        "GRIDFLEET_STACK": self.stack_id,
                        "GRIDFLEET_RUN": run_id,
                        "GRIDFLEET_INSTANCE": iid,
                        "GRIDFLEET_ROLE": "node",
                    },
                    log_path=d / "node.log",
                    extra_env=self.extra_env,
                )
            except OSError as e:
                entry["state"] = "terminated"
                self._write(entry)
                errors.append(f"{iid}: {e}")
                continue
            with self._lock:
                self._children[iid] = p
            entry.update(state="running", pid=p.pid, start_ticks=procs.start_ticks(p.pid))
            self._write(entry)
            launched.append(iid)
        return LaunchResult(tuple(launched), tuple(errors))

    def terminate(self, instance_ids: Sequence[str]) -> None:
        ids = set(instance_ids)
        if not ids:
            return
        procs.kill_tree(
            lambda ps: [
                p
                for p in ps
                if p.alive
                and p.markers.get("GRIDFLEET_INSTANCE") in ids
                and p.markers.get("GRIDFLEET_STACK") == self.stack_id
            ]
        )
        for iid in ids:
            e = self._read(self.instance_dir(iid) / "instance.json")
            if e and e.get("state") != "terminated":
                e.update(state="terminated", terminated_at=self.clock.now())
                self._write(e)
        self._reap()

    def hub_alive(self, hub_id: str) -> bool:
        """Hub ids on the embedded default are `local:<pid>:<start ticks>`."""
        try:
            kind, pid, ticks = hub_id.split(":")
            return kind == "local" and procs.pid_alive(int(pid), int(ticks))
        except ValueError:  # not an id this provider made
            return False

    def _reap(self) -> None:
        with self._lock:
            for iid, p in list(self._children.items()):
                if p.poll() is not None:  # type: ignore[attr-defined]
                    del self._children[iid]


def local_hub_id() -> str:
    pid = os.getpid()
    return f"local:{pid}:{procs.start_ticks(pid)}"
