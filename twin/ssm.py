"""The twin's SSM agent: `AWS-RunShellScript` commands sent through moto run for real inside twin instances.

What moto does: SendCommand stores a `Command` in the region's SSM backend whose per-instance invocations
(plain dicts in `command.invocations`) say Success, ResponseCode 0 and no output from the moment it is
sent; it runs nothing and knows of no agent. GetCommandInvocation returns such a dict as it is, and
ListCommands each command's `response_object()` (its `status`, `status_details`, `completed_count` and
`error_count`). moto has no ListCommandInvocations and no CancelCommand.

What the twin changes, all in `_MotoCommands`: the backend object's `send_command` is wrapped (that object
only, not moto's class; wrapped again on the next pass after a reset of moto) so that a command to an instance
that is not managed (not running in the twin, or running no SSM agent: see `twin.instance.standins`) is refused
with AWS's own error, `InvalidInstanceId` ("Instances [[i-...]] not in a valid state for account ..."); a command
goes to the instances it names only (moto adds every instance of the region when no Targets are given), and an
`AWS-RunShellScript` command starts Pending, as on AWS, instead of Success; an invocation is replaced by a
new dict, never changed in place, so that moto's server threads read either the old or the new outcome; and
the command's own status fields follow its invocations. Other documents keep moto's Success.

`TwinSsmAgent.poll()` hands every Pending invocation to the instance it targets: the parameter `commands`,
joined into one bash script, runs inside the instance as root (in `workingDirectory` when given), bounded
by `executionTimeout` (default 3600 s, as the document says) under GNU `timeout`, which then kills the
script's whole process group. Each runs in a thread of its own. The outcomes, by AWS's table of command
statuses (Status / StatusDetails / ResponseCode):

  InProgress / InProgress / -1        while it runs
  Success / Success / 0               it exited 0
  Failed / Failed / exit status       it exited non-zero
  TimedOut / ExecutionTimedOut / -1   killed at executionTimeout
  Failed / Undeliverable / -1         the instance stopped, or its agent, between the send and the delivery

StandardOutputContent keeps the first 24,000 characters of stdout and StandardErrorContent the first 8,000
of stderr, as GetCommandInvocation does. Not like AWS: the stand-in agent needs no instance profile to
register; a command whose instance went away after the send is Undeliverable at once rather than Pending
until its delivery timeout.
"""

from __future__ import annotations

import datetime
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

RUN_SHELL_SCRIPT = "AWS-RunShellScript"
DEFAULT_EXECUTION_TIMEOUT_S = 3600
MAX_EXECUTION_TIMEOUT_S = 172_800  # the document's own limit (48 hours)
MAX_STDOUT_CHARS = 24_000
MAX_STDERR_CHARS = 8_000
#: After executionTimeout, GNU timeout sends SIGTERM; this much later, SIGKILL.
KILL_AFTER_S = 5
#: `timeout`'s exit status when it ended the command (SIGTERM: 124; SIGKILL after --kill-after: 137).
_TIMEOUT_EXITS = (124, 137)
_TERMINAL = ("Success", "Failed", "TimedOut", "Cancelled")


class Runner(Protocol):
    """What runs a command inside an instance (an `InstanceSandbox`)."""

    def run(self, argv: list[str], timeout_s: float = ...) -> subprocess.CompletedProcess[str]: ...


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


class _MotoCommands:
    """The one place that reads and changes moto's SSM command objects (see the module docstring)."""

    def __init__(self, backend_of: Callable[[], Any], managed: Callable[[str], object]):
        self.backend_of = backend_of
        self.managed = managed  # an instance id -> something truthy when SSM can deliver to it
        self.backend: Any = None
        self._lock = threading.Lock()  # one writer at a time: a command's status is computed from all its invocations
        self.attach()

    def attach(self) -> None:
        """Wrap the backend's `send_command`; again after a reset of moto (which clears or replaces the backend)."""
        backend = self.backend_of()
        if getattr(backend.__dict__.get("send_command"), "_twin_agent", None) is self:
            return
        original = backend.send_command

        def send_command(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("document_name") == RUN_SHELL_SCRIPT:
                problem = parameters_problem(kwargs.get("parameters") or {})
                if problem:
                    from moto.ssm.exceptions import SSMException

                    raise SSMException("InvalidParameters", problem)  # SendCommand answers with this error
            asked = list(kwargs.get("instance_ids") or [])  # moto extends the caller's list in place
            unmanaged = [i for i in asked if not self.managed(i)]
            if unmanaged:
                from moto.ssm.exceptions import SSMException

                account = getattr(backend, "account_id", "123456789012")
                raise SSMException(
                    "InvalidInstanceId",
                    f"Instances [[{', '.join(unmanaged)}]] not in a valid state for account {account}",
                )
            command = original(*args, **kwargs)
            if not command.targets:  # moto adds every instance of the region when no Targets are given
                command.instance_ids = [i for i in command.instance_ids if i in asked]
                command.invocations = [inv for inv in command.invocations if inv["InstanceId"] in asked]
                command.target_count = len(command.invocations)
            if command.document_name == RUN_SHELL_SCRIPT:
                for inv in list(command.invocations):
                    self.set(command, inv["InstanceId"], Status="Pending", StatusDetails="Pending", ResponseCode=-1)
            return command

        send_command._twin_agent = self  # type: ignore[attr-defined]
        backend.send_command = send_command  # an attribute of this backend object only
        self.backend = backend

    def detach(self) -> None:
        """Give the backend moto's own `send_command` back."""
        if self.backend is not None and "send_command" in self.backend.__dict__:
            del self.backend.send_command

    def pending(self) -> list[tuple[Any, dict[str, Any]]]:
        """(command, invocation) of every Pending run-shell-script invocation, oldest command first."""
        self.attach()
        found = []
        for command in list(self.backend.list_commands(None, None)):
            if command.document_name != RUN_SHELL_SCRIPT:
                continue
            found += [(command, inv) for inv in list(command.invocations) if inv.get("Status") == "Pending"]
        return found

    def set(self, command: Any, instance_id: str, **fields: Any) -> None:
        """Replace the invocation of `instance_id` by a copy with `fields`; then the command's own status."""
        with self._lock:
            self._set(command, instance_id, fields)

    def _set(self, command: Any, instance_id: str, fields: dict[str, Any]) -> None:
        for i, inv in enumerate(command.invocations):
            if inv["InstanceId"] == instance_id:
                command.invocations[i] = {**inv, **fields}
        states = [inv["Status"] for inv in command.invocations]
        details = [inv["StatusDetails"] for inv in command.invocations]
        done = [s for s in states if s in _TERMINAL]
        command.completed_count = len(done)
        command.error_count = sum(1 for d in details if d in ("Failed", "ExecutionTimedOut"))
        if len(done) < len(states):
            command.status = command.status_details = "InProgress" if "InProgress" in states else "Pending"
        elif all(s == "Success" for s in states):
            command.status = command.status_details = "Success"
        elif len(set(details)) == 1:
            command.status, command.status_details = states[0], details[0]
        else:
            command.status, command.status_details = "Failed", "Incomplete"


def parameters_problem(parameters: dict[str, list[str]]) -> str | None:
    """What is wrong with an AWS-RunShellScript's parameters (as SendCommand refuses them), or None."""
    if not parameters.get("commands"):
        return "AWS-RunShellScript needs the parameter commands"
    raw = (parameters.get("executionTimeout") or [str(DEFAULT_EXECUTION_TIMEOUT_S)])[0]
    if not (isinstance(raw, str) and raw.isdigit() and 1 <= int(raw) <= MAX_EXECUTION_TIMEOUT_S):
        return f"executionTimeout {raw!r} is not a whole number of seconds from 1 to {MAX_EXECUTION_TIMEOUT_S}"
    return None


def shell_argv(parameters: dict[str, list[str]]) -> tuple[list[str], float]:
    """The command line that runs an AWS-RunShellScript's parameters in the instance, and its timeout (s).

    The parameters are as `parameters_problem` lets through."""
    commands = parameters.get("commands") or []
    script = "\n".join(commands)
    workdir = (parameters.get("workingDirectory") or [""])[0]
    if workdir:
        script = f'cd -- "$1" || exit 1\n{script}'
    timeout_s = float((parameters.get("executionTimeout") or [str(DEFAULT_EXECUTION_TIMEOUT_S)])[0])
    argv = ["timeout", f"--kill-after={KILL_AFTER_S}", f"{timeout_s:g}", "bash", "-c", script, "ssm-script"]
    return (argv + [workdir] if workdir else argv), timeout_s


def outcome(returncode: int, elapsed_s: float, timeout_s: float) -> dict[str, Any]:
    """Status, StatusDetails and ResponseCode of a script that ended with `returncode` after `elapsed_s`."""
    if returncode in _TIMEOUT_EXITS and elapsed_s >= timeout_s:
        return {"Status": "TimedOut", "StatusDetails": "ExecutionTimedOut", "ResponseCode": -1}
    if returncode == 0:
        return {"Status": "Success", "StatusDetails": "Success", "ResponseCode": 0}
    return {"Status": "Failed", "StatusDetails": "Failed", "ResponseCode": returncode}


class TwinSsmAgent:
    """Runs the twin's SSM commands: `poll()` once, or `start(interval_s)` ... `stop()` in the background."""

    def __init__(
        self,
        backend_of: Callable[[], Any],
        find_instance: Callable[[str], Runner | None],
        *,
        now: Callable[[], float] = time.time,
    ):
        """`backend_of()` is moto's SSM backend object of the twin's account and region (looked up on each pass);
        `find_instance(id)` the instance when SSM can deliver to it (running, its agent online), else None."""
        self.moto = _MotoCommands(backend_of, find_instance)
        self.find_instance = find_instance
        self.now = now
        self._handled: set[tuple[str, str]] = set()
        self._workers: list[threading.Thread] = []
        self._loop: threading.Thread | None = None
        self._stopping = threading.Event()

    @classmethod
    def for_region(cls, account_id: str, region: str, find_instance: Callable[[str], Runner | None]) -> TwinSsmAgent:
        """The agent of moto's in-process SSM backend of this account and region."""
        from moto.ssm.models import ssm_backends

        return cls(lambda: ssm_backends[account_id][region], find_instance)

    def poll(self) -> int:
        """Start every command invocation not handled yet; how many were started (or found undeliverable)."""
        started = 0
        for command, inv in self.moto.pending():
            key = (command.command_id, inv["InstanceId"])
            if key in self._handled:
                continue
            self._handled.add(key)
            started += 1
            box = self.find_instance(inv["InstanceId"])
            if box is None:
                fields = {"Status": "Failed", "StatusDetails": "Undeliverable", "ResponseCode": -1}
                self.moto.set(command, inv["InstanceId"], **fields, ExecutionEndDateTime=_iso(self.now()))
                continue
            start = self.now()
            fields = {"Status": "InProgress", "StatusDetails": "InProgress", "ResponseCode": -1}
            self.moto.set(command, inv["InstanceId"], **fields, ExecutionStartDateTime=_iso(start))
            worker = threading.Thread(
                target=self._run,
                args=(command, inv["InstanceId"], box, start),
                name=f"twin-ssm-{key[0][:8]}",
                daemon=True,
            )
            self._workers.append(worker)
            worker.start()
        self._workers = [w for w in self._workers if w.is_alive()]
        return started

    def _run(self, command: Any, instance_id: str, box: Runner, start: float) -> None:
        argv, timeout_s = shell_argv(command.parameters or {})
        began = time.monotonic()
        try:
            done = box.run(argv, timeout_s=timeout_s + KILL_AFTER_S + 30)
            code, out, err = done.returncode, done.stdout or "", done.stderr or ""
        except subprocess.TimeoutExpired:
            code, out, err = 137, "", "the twin gave up waiting for the command"
        except Exception as e:  # the instance went away while the command ran
            code, out, err = 1, "", f"{type(e).__name__}: {e}"
        elapsed = time.monotonic() - began
        fields = outcome(code, elapsed, timeout_s)
        fields["StandardOutputContent"] = out[:MAX_STDOUT_CHARS]
        fields["StandardErrorContent"] = err[:MAX_STDERR_CHARS]
        fields["ExecutionElapsedTime"] = f"PT{elapsed:.3f}S"
        fields["ExecutionEndDateTime"] = _iso(start + elapsed)
        self.moto.set(command, instance_id, **fields)

    def running(self) -> int:
        """How many commands run now."""
        return sum(1 for w in self._workers if w.is_alive())

    def start(self, interval_s: float = 0.5) -> TwinSsmAgent:
        """Poll every `interval_s` in a background thread until `stop()`."""
        if self._loop is not None:
            return self
        self._stopping.clear()

        def loop() -> None:
            while not self._stopping.wait(interval_s):
                try:
                    self.poll()
                except Exception:  # moto's state changed under the pass (a reset); the next pass reads it anew
                    log.exception("twin SSM agent: poll failed")

        self._loop = threading.Thread(target=loop, name="twin-ssm-agent", daemon=True)
        self._loop.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the background loop (commands already running go on to their end); idempotent."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.join(timeout_s)
            self._loop = None

    def close(self) -> None:
        """Stop, and give moto's backend its own SendCommand back."""
        self.stop()
        self.moto.detach()
