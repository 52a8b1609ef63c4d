"""The channels of fleet.yaml's `notify` (an SNS topic, a Slack-compatible webhook), and the run's end message.

Each send is one bounded try: the webhook one POST with `notify.timeout_s` on the connection and each read, no
redirect followed, no retry; SNS one `Publish` through a client that makes at most two attempts. Failures come
back to `fleet.outputs.notify.send_all`, which logs them and goes on. The webhook URL is a secret: it lives only in the
channel, which names itself by scheme and host alone and its errors by status, class or the OS's words, never
by an exception's text (urllib's quote the URL).

The hub's executor imports this module, and the simulator runs that hub without boto3: the AWS clients (and the
bucket's archive) are made, and boto3 loaded, only when a message is sent.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fleet.config import Config, NotifyConfig
from fleet.logs import event
from fleet.outputs.archive import RunArchive, report_key
from fleet.outputs.notify import Channel, Message, overdue_message, redact_url, run_message, send_all
from fleet.outputs.summary import build_summary
from fleet.record.ids import is_run_id
from fleet.record.table import StateTable

if TYPE_CHECKING:
    from fleet.aws.clients import AwsClients

log = logging.getLogger("gridfleet.notify")

#: At most this much of a webhook's answer is read (it is only drained, never used).
MAX_ANSWER_BYTES = 64 * 1024
#: SNS attempts per message (botocore's retries of a throttled or failed call included).
SNS_ATTEMPTS = 2


class NotifyFailed(Exception):
    """A channel could not deliver; the text names no secret."""


class SnsChannel:
    def __init__(self, client: Any, topic_arn: str):
        self._c = client
        self.topic_arn = topic_arn

    @property
    def name(self) -> str:
        return f"sns:{self.topic_arn}"

    def send(self, message: Message) -> None:
        self._c.publish(TopicArn=self.topic_arn, Subject=message.subject, Message=message.text)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is answered as the error it then is: the message goes where it was told, or not


class WebhookChannel:
    def __init__(self, url: str, timeout_s: float):
        self._url = url
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(_NoRedirect())

    @property
    def name(self) -> str:
        return f"webhook:{redact_url(self._url)}"

    def send(self, message: Message) -> None:
        body = json.dumps(message.slack()).encode()
        try:
            req = urllib.request.Request(
                self._url, data=body, method="POST", headers={"Content-Type": "application/json; charset=utf-8"}
            )
            with self._opener.open(req, timeout=self.timeout_s) as answer:
                answer.read(MAX_ANSWER_BYTES)
        except Exception as e:  # noqa: BLE001 - whatever urllib or http.client raise, their text may quote the URL
            raise NotifyFailed(failure_reason(e)) from None


def failure_reason(e: BaseException) -> str:
    """Why a webhook send failed, in words that cannot hold its URL: an HTTP status, an exception's class, the
    operating system's text for a socket error. Never an exception's own message: urllib's and http.client's
    quote the URL (`InvalidURL`, `ValueError`), userinfo, path and query included."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"  # not its reason phrase: that is the receiver's text
    if isinstance(e, urllib.error.URLError):
        return "cannot reach it: " + (failure_reason(e.reason) if isinstance(e.reason, BaseException) else "URLError")
    if isinstance(e, TimeoutError):
        return "TimeoutError: timed out"
    if isinstance(e, OSError) and e.strerror:
        return f"{type(e).__name__}: {e.strerror}"
    return type(e).__name__


def channels(notify: NotifyConfig, sns_client: Any | None) -> list[Channel]:
    """The configured channels; SNS only with a client."""
    out: list[Channel] = []
    if notify.sns_topic_arn and sns_client is not None:
        out.append(SnsChannel(sns_client, notify.sns_topic_arn))
    if notify.webhook_url is not None:
        out.append(WebhookChannel(notify.webhook_url.get_secret_value(), notify.timeout_s))
    return out


def is_embedded(config: Config) -> bool:
    """The embedded default: AWS is the moto server on this machine."""
    host = urlsplit(config.aws.endpoint_url).hostname if config.aws.endpoint_url else None
    return host in ("127.0.0.1", "localhost", "::1")


def notify_clients(config: Config) -> AwsClients:
    """Clients for the senders: few attempts, so a dead endpoint costs seconds, not minutes."""
    from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients

    aws = config.aws.model_copy(update={"max_retries": min(config.aws.max_retries, SNS_ATTEMPTS - 1)})
    return AwsClients(aws, credentials=LOCAL_CREDENTIALS if is_embedded(config) else None)


def report_location(config: Config, run_id: str, out_dir: Path) -> str:
    """Where the run's report is: its key in the bucket on AWS, the local file on the embedded default."""
    if not is_embedded(config):
        return f"s3://{config.aws.bucket}/{report_key(run_id)}"
    return str((out_dir / run_id / "report.html").absolute())


def previous_summary(table: StateTable, archive: RunArchive | None, run_id: str) -> dict[str, Any] | None:
    """The summary of the run before `run_id` by the table's run index: archived in the bucket, else rebuilt
    from the table when it still holds that run."""
    runs = table.list_runs()  # oldest first
    mine = next((e for e in runs if e.run_id == run_id), None)
    earlier = [e.run_id for e in runs if e.run_id != run_id and (mine is None or e.started_at <= mine.started_at)]
    if not earlier or not is_run_id(earlier[-1]):  # read back from the table: checked again before it names a key
        return None
    prev = earlier[-1]
    found = archive.get_summary(prev) if archive is not None else None
    if found is not None:
        return found
    rows = table.read_run(prev)
    if rows.run is None:
        return None
    return build_summary(
        rows.run, rows.sites, left_running=0, finished_at=rows.run.finished_at or 0.0, finish_reason=""
    )


def notify_run_end(
    config: Config,
    summary: Mapping[str, Any],
    *,
    table: StateTable,
    out_dir: Path,
    clients: AwsClients | None = None,
) -> list[str]:
    """Send the finished run's message on every configured channel; the channels that took it. Never raises."""
    if not config.notify.enabled:
        return []
    from fleet.aws.archive import S3RunArchive

    run_id, arn = str(summary.get("run_id")), config.notify.sns_topic_arn
    clients = clients or notify_clients(config)
    try:
        previous = previous_summary(table, S3RunArchive(clients.client("s3"), config.aws.bucket), run_id)
    except Exception as e:  # noqa: BLE001 - the message goes without its comparison
        event(log, "notify-no-previous", logging.WARNING, run_id=run_id, error=f"{type(e).__name__}: {e}")
        previous = None
    try:
        sns = clients.client("sns") if arn else None
    except Exception as e:  # noqa: BLE001 - no client, no SNS message; the webhook still goes
        event(
            log, "notify-failed", logging.WARNING, run_id=run_id, channel=f"sns:{arn}", error=f"{type(e).__name__}: {e}"
        )
        sns = None
    message = run_message(summary, previous, report_location(config, run_id, out_dir))
    return send_all(channels(config.notify, sns), message, run_id=run_id)


def notify_finished(
    config: Config, table: StateTable, run_id: str, reason: str, left_running: int, now: float, out_dir: Path
) -> list[str]:
    """The hub's end of a run: its summary as it ends, sent on the configured channels. Never raises."""
    if not config.notify.enabled:
        return []
    try:
        rows = table.read_run(run_id)
        if rows.run is None:
            raise LookupError(f"run {run_id} has no run item")
        summary = build_summary(
            rows.run,
            rows.sites,
            left_running=left_running,
            finished_at=now,
            finish_reason=reason,
            unreadable=rows.notes.found,
        )
        return notify_run_end(config, summary, table=table, out_dir=out_dir)
    except Exception as e:  # noqa: BLE001 - a lost message must never fail the run
        event(log, "notify-failed", logging.WARNING, run_id=run_id, channel="all", error=f"{type(e).__name__}: {e}")
        return []


def notify_overdue(sns_client: Any, topic_arn: str | None, ended: Mapping[str, Any], grace_s: float) -> list[str]:
    """The watchdog's message for a run it ended (`ended`: its run_id, failed sites and summary). Never raises."""
    if not topic_arn or sns_client is None:
        return []
    run_id = str(ended["run_id"])
    message = overdue_message(run_id, list(ended.get("failed") or ()), grace_s, ended.get("summary"))
    return send_all([SnsChannel(sns_client, topic_arn)], message, run_id=run_id)
