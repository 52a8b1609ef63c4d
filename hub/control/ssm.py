"""Node control through SSM Run Command: the kill ladder's first remote rung.

SSM needs the SSM agent running on the node and the instance profile allowing it; when it cannot deliver
(`InvalidInstanceId`: the instance is not managed, or its agent is down) the rung fails and the ladder falls
through to SSH. It never raises: every error becomes a failed `KillResult`, so the executor always gets an
answer and can move on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fleet.aws.clients import RETRYABLE_CODES, error_code
from fleet.clock import Clock
from hub.control.base import KillResult
from hub.control.command import error_detail, kill_command, output_tail

#: Command statuses (Status or StatusDetails of GetCommandInvocation) after which nothing more happens.
SSM_FAILED_STATUSES = frozenset(
    {
        "Failed",
        "TimedOut",
        "Cancelled",
        "Cancelling",
        "Undeliverable",
        "Terminated",
        "DeliveryTimedOut",
        "ExecutionTimedOut",
    }
)
#: Statuses of a command that has not finished yet.
SSM_PENDING_STATUSES = frozenset({"Pending", "InProgress", "Delayed"})
#: SendCommand's TimeoutSeconds (how long SSM tries to deliver the command) may not be lower than this.
SSM_MIN_DELIVERY_TIMEOUT_S = 30


class SsmControl:
    """Kill through SSM Run Command (`AWS-RunShellScript`), waiting on the injected clock for its result."""

    path = "ssm"

    def __init__(
        self,
        ssm_client: Any,
        clock: Clock,
        *,
        timeout_s: float = 60.0,
        poll_s: float = 1.0,
        command: Callable[[str, int], str] = kill_command,
    ):
        self.ssm = ssm_client
        self.clock = clock
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.command = command

    def kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        try:
            return self._kill(instance_id, site, attempt)
        except (ClientError, BotoCoreError) as e:
            return KillResult(False, self.path, error_detail(e))
        except Exception as e:  # the ladder must go on to the next rung whatever happened here
            return KillResult(False, self.path, f"{type(e).__name__}: {e}")

    def _kill(self, instance_id: str, site: str, attempt: int) -> KillResult:
        deadline = self.clock.monotonic() + self.timeout_s
        try:
            sent = self.ssm.send_command(
                InstanceIds=[instance_id],
                DocumentName="AWS-RunShellScript",
                Parameters={"commands": [self.command(site, attempt)]},
                TimeoutSeconds=max(SSM_MIN_DELIVERY_TIMEOUT_S, int(self.timeout_s)),
                Comment=f"gridfleet kill {site} attempt {attempt}"[:100],
            )
        except ClientError as e:
            # InvalidInstanceId: not a managed instance, or its agent is not running. Any other code
            # (UnsupportedPlatformType, AccessDenied..., throttling left after botocore's retries)
            # equally means this rung cannot do it now.
            return KillResult(False, self.path, error_detail(e))
        command_id = sent["Command"]["CommandId"]
        status, detail = "Pending", "no invocation yet"
        while True:
            try:
                inv = self.ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
            except ClientError as e:
                code = error_code(e)
                if code != "InvocationDoesNotExist" and code not in RETRYABLE_CODES:
                    return KillResult(False, self.path, error_detail(e))
                # Not registered yet right after SendCommand (or throttled): look again.
            else:
                status = inv.get("Status") or "Pending"
                details = inv.get("StatusDetails") or status
                out = output_tail(inv.get("StandardOutputContent"))
                err = output_tail(inv.get("StandardErrorContent"))
                if status == "Success":
                    return KillResult(True, self.path, out or "Success")
                if status in SSM_FAILED_STATUSES or details in SSM_FAILED_STATUSES:
                    parts = [p for p in (details if details != status else "", err, out) if p]
                    code = inv.get("ResponseCode")
                    if code not in (None, -1):
                        parts.insert(0, f"exit status {code}")
                    return KillResult(False, self.path, f"{status}: {'; '.join(parts) or 'no output'}")
                detail = details
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                break
            self.clock.sleep(min(self.poll_s, remaining))
        self._cancel(command_id, instance_id)
        return KillResult(
            False, self.path, f"TimedOut: command {command_id} still {status} ({detail}) after {self.timeout_s:g}s"
        )

    def _cancel(self, command_id: str, instance_id: str) -> None:
        """Best effort: a command that was never delivered should not run once the ladder has moved on."""
        try:
            self.ssm.cancel_command(CommandId=command_id, InstanceIds=[instance_id])
        except Exception:
            pass
