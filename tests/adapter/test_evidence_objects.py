"""How evidence objects are stored in the bucket (moto server): what the crawled page wrote is never served from
the bucket's origin, the origin of the run's report, as a page.

The browser is the one fake, at the node's `Capture` seam: it answers with a page whose HTML holds a script.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from fleet.aws.results import S3ResultStore
from fleet.outputs.results import RunKeys
from fleet.outputs.summary import export_evidence
from fleet.record.state import Attempt, RunStatus, SiteRecord, SiteSpec, SiteStatus
from node.evidence import Evidence, keep

from .conftest import REGION, moto_clients

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
HOSTILE = "<html><script>fetch('report.html').then(r => r.text()).then(steal)</script></html>"
PREFIX = "s1/20261121/evidence/1/"
RUN = "2026-11-21"


@pytest.fixture
def bucket(aws_config) -> tuple[Any, S3ResultStore]:
    aws = aws_config(bucket=f"b-{uuid.uuid4().hex}")
    s3 = moto_clients(aws).client("s3")
    s3.create_bucket(Bucket=aws.bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    return s3, S3ResultStore(s3, aws.bucket)


def stored(s3: Any, store: S3ResultStore, name: str) -> tuple[str, str | None]:
    head = s3.head_object(Bucket=store.bucket, Key=PREFIX + name)
    return head["ContentType"], head.get("ContentDisposition")


def test_the_pages_html_is_stored_as_text_to_download(bucket, tmp_path):
    """The node writes its evidence under its own prefix, each file a new object; the hub's copy beside the result,
    made as it exports the run (the one the report links), is stored by the file's name, whatever the node said:
    the page's HTML as text to download."""
    s3, store = bucket

    def capture(session_id: str) -> Evidence:
        return Evidence(answered=True, url="http://x.test/", screenshot=PNG, html=HOSTILE)

    keep(capture, store, ("s1", "20261121", "2026-11-21", 1, "local:i-0aaa"), {"site": "s1"}, "session-1")
    staged = f"staging/local:i-0aaa/{PREFIX}"
    assert store.get(staged + "page.html") == HOSTILE.encode()
    assert not store.put_staged(staged + "page.html", b"<script>later</script>", "text/html")  # never replaced
    s3.put_object(Bucket=store.bucket, Key=staged + "screenshot.png", Body=PNG, ContentType="text/html")  # as if
    spec = SiteSpec("http://x.test/")
    rec = SiteRecord(
        RUN, "s1", spec, RunStatus.FAILED, SiteStatus.FAILED, 1, attempts=(Attempt(1, "i-0aaa", 1.0, 2.0, "error"),)
    )
    export_evidence(tmp_path, RunKeys.of(RUN, "20261121"), [rec], store)

    assert stored(s3, store, "page.html") == ("text/plain; charset=utf-8", "attachment")
    assert store.get(PREFIX + "page.html") == HOSTILE.encode()  # the bytes as the page wrote them
    assert stored(s3, store, "screenshot.png") == ("image/png", None)
    assert stored(s3, store, "console.json") == ("application/json", None)
    assert stored(s3, store, "evidence.json") == ("application/json", None)


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "TEXT/HTML", "image/svg+xml"])
def test_no_evidence_file_is_stored_as_a_document_whatever_its_writer_says(bucket, content_type):
    s3, store = bucket
    store.put_evidence(PREFIX + "page.html", HOSTILE.encode(), content_type)
    store.put_evidence(PREFIX + "console.json", HOSTILE.encode(), content_type)
    assert stored(s3, store, "page.html") == ("text/plain; charset=utf-8", "attachment")
    assert stored(s3, store, "console.json") == ("text/plain; charset=utf-8", "attachment")
