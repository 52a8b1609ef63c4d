"""The site queue on SQS (`fleet.record.messages.SiteQueue`), and its dead-letter queue.

A message is `{"run_id", "site", "attempt"}`: "attempt N of this site may start" (`fleet.record.messages`).
Duplicates are harmless (a claim is conditional on the record), so sending is
at-least-once. A body that is not such a message is left alone: SQS moves it
to the DLQ after `max_receive_count` receives, and the hub reports it.

On a FIFO queue (`aws.queue_fifo`, a name ending in .fifo) each message carries
a deterministic deduplication id of its (run, site, attempt), so SQS keeps one
of the sends of the same attempt within its 5-minute window (a restarted hub's
second seeding, a repaired enqueue), and a message group per site, so a site's
message in flight never holds back another site's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.errors import MissingResource
from fleet.record.messages import BadMessage, QueueDepth, SiteMessage, decode, encode, fifo_fields


class SqsSiteQueue:
    """The run's queue and its DLQ, by name, through one boto3 client."""

    def __init__(self, client: Any, queue_name: str, dlq_name: str):
        self._c = client
        self.queue_name = queue_name
        self.dlq_name = dlq_name
        self._url: str | None = None
        self._dlq_url: str | None = None
        #: A FIFO queue: sends carry a message group (per site) and a deduplication id (per attempt).
        self.fifo = queue_name.endswith(".fifo")

    def _lookup(self, name: str) -> str:
        try:
            return self._c.get_queue_url(QueueName=name)["QueueUrl"]
        except ClientError as e:
            if error_code(e) in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"):
                raise MissingResource(f"SQS queue {name!r} does not exist") from None
            raise

    @property
    def url(self) -> str:
        if self._url is None:
            self._url = self._lookup(self.queue_name)
        return self._url

    @property
    def dlq_url(self) -> str:
        if self._dlq_url is None:
            self._dlq_url = self._lookup(self.dlq_name)
        return self._dlq_url

    def check_exists(self) -> None:
        _ = self.url, self.dlq_url

    def _fields(self, run_id: str, site: str, attempt: int, given_back: int = 0) -> dict[str, str]:
        body = {"MessageBody": encode(run_id, site, attempt)}
        return {**body, **fifo_fields(run_id, site, attempt, given_back)} if self.fifo else body

    def send(self, run_id: str, site: str, attempt: int, given_back: int = 0) -> None:
        self._c.send_message(QueueUrl=self.url, **self._fields(run_id, site, attempt, given_back))

    def send_many(self, items: Iterable[tuple[str, str, int]]) -> int:
        """Send each, ten to a SendMessageBatch; the number sent."""
        batch: list[tuple[str, str, int]] = []
        sent = 0
        for item in items:
            batch.append(item)
            sent += 1
            if len(batch) == 10:
                self._send_batch(batch)
                batch = []
        if batch:
            self._send_batch(batch)
        return sent

    def _send_batch(self, batch: list[tuple[str, str, int]]) -> None:
        entries = [{"Id": str(i), **self._fields(*item)} for i, item in enumerate(batch)]
        out = self._c.send_message_batch(QueueUrl=self.url, Entries=entries)
        for failed in out.get("Failed", []):  # send the few that failed one by one (botocore retries those)
            self.send(*batch[int(failed["Id"])])

    def receive(self, wait_s: float, visibility_s: float) -> SiteMessage | BadMessage | None:
        out = self._c.receive_message(
            QueueUrl=self.url,
            MaxNumberOfMessages=1,
            WaitTimeSeconds=int(max(0, min(20, wait_s))),
            VisibilityTimeout=int(visibility_s),
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        msgs = out.get("Messages", [])
        if not msgs:
            return None
        m = msgs[0]
        count = int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1))
        return decode(m["Body"], m["ReceiptHandle"], m.get("MessageId", ""), count)

    def delete(self, msg: SiteMessage | BadMessage) -> None:
        try:
            self._c.delete_message(QueueUrl=self.url, ReceiptHandle=msg.receipt)
        except ClientError as e:
            if error_code(e) not in ("ReceiptHandleIsInvalid", "InvalidParameterValue"):
                raise

    def delete_receipt(self, receipt: str) -> None:
        """Delete the message received with `receipt` (by whoever received it); gone already is fine."""
        self.delete(BadMessage("", receipt, "", 0, ""))

    def set_visibility(self, msg: SiteMessage | BadMessage, seconds: float) -> None:
        try:
            self._c.change_message_visibility(
                QueueUrl=self.url, ReceiptHandle=msg.receipt, VisibilityTimeout=int(max(0, seconds))
            )
        except ClientError as e:
            if error_code(e) not in ("ReceiptHandleIsInvalid", "InvalidParameterValue", "MessageNotInflight"):
                raise

    def peek(self, limit: int = 100, dlq: bool = False) -> list[SiteMessage | BadMessage]:
        """Up to `limit` messages, left in place (received with visibility 0; their receive count goes up)."""
        url = self.dlq_url if dlq else self.url
        seen: dict[str, SiteMessage | BadMessage] = {}
        for _ in range(max(1, limit // 10) + 2):
            out = self._c.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=0,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
            new = [m for m in out.get("Messages", []) if m.get("MessageId") not in seen]
            if not new:
                break
            for m in new:
                count = int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1))
                seen[m.get("MessageId", "")] = decode(m["Body"], m["ReceiptHandle"], m.get("MessageId", ""), count)
            if len(seen) >= limit:
                break
        return list(seen.values())[:limit]

    def depth(self) -> QueueDepth:
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        q = self._c.get_queue_attributes(QueueUrl=self.url, AttributeNames=names)["Attributes"]
        d = self._c.get_queue_attributes(QueueUrl=self.dlq_url, AttributeNames=names[:1])["Attributes"]
        return QueueDepth(int(q.get(names[0], 0)), int(q.get(names[1], 0)), int(d.get(names[0], 0)))
