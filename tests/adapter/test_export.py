"""A run's export (`fleet.outputs.summary.export`) read from a bucket on the moto server: a re-export replaces the
earlier `results/` and `evidence/` only when every read for them succeeded.

S3 failing midway is what moto cannot do: a botocore `before-call` hook on this test's own client fails the
reads once armed (the seam botocore offers; the calls before it are real).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from fleet.aws.clients import AwsClients
from fleet.aws.results import S3ResultStore
from fleet.outputs.results import evidence_key, result_key
from fleet.outputs.summary import export
from fleet.record.state import Attempt, RunStatus, SiteRecord, SiteSpec

from .conftest import REGION, moto_clients

RUN, DATE = "2026-11-21", "20261121"
SUMMARY = {"run_id": RUN, "run_date": DATE, "sites": {}}


class Outage:
    """Fails the armed operations from their `after`-th call on (0: at once), as an unreachable S3 would."""

    def __init__(self) -> None:
        self.ops: dict[str, int] = {}

    def arm(self, operation: str, after: int = 0) -> None:
        self.ops[operation] = after

    def hook(self, service: str, client: Any) -> None:
        def before_call(model: Any, **_: Any) -> None:
            left = self.ops.get(model.name)
            if left is None:
                return
            if left > 0:
                self.ops[model.name] = left - 1
                return
            raise EndpointConnectionError(endpoint_url="http://s3.unreachable.test")

        client.meta.events.register(f"before-call.{service}", before_call)


@pytest.fixture
def bucket(aws_config) -> tuple[S3ResultStore, Outage]:
    outage = Outage()
    aws = aws_config(bucket=f"b-{uuid.uuid4().hex}")
    clients: AwsClients = moto_clients(aws, on_client=(outage.hook,))
    s3 = clients.client("s3")
    s3.create_bucket(Bucket=aws.bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    return S3ResultStore(s3, aws.bucket), outage


def sites() -> list[SiteRecord]:
    spec = SiteSpec("http://x.test/")
    done = [
        SiteRecord(RUN, s, spec, run_status=RunStatus.COMPLETED, result_key=result_key(s, DATE, RUN))
        for s in ("a", "b", "c")
    ]
    failed = SiteRecord(RUN, "d", spec, run_status=RunStatus.FAILED, attempts=(Attempt(1, "i-1", 0.0, 1.0, "error"),))
    return [*done, failed]


def fill(store: S3ResultStore, version: str) -> None:
    """Every site's result and site d's evidence, their bodies naming `version`."""
    for s in ("a", "b", "c"):
        store._c.put_object(Bucket=store.bucket, Key=result_key(s, DATE, RUN), Body=f'{{"v": "{version}"}}'.encode())
    for name in ("evidence.json", "page.html"):  # as node i-1 wrote it, under its own prefix (a local node's)
        key = evidence_key("d", DATE, RUN, 1, name, "local:i-1")
        store._c.put_object(Bucket=store.bucket, Key=key, Body=f"{version} {name}".encode())


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def exported(tmp_path: Path, store: S3ResultStore) -> dict[str, bytes]:
    export(tmp_path / "runs", SUMMARY, sites(), store)
    return tree(tmp_path / "runs" / RUN)


def test_a_re_export_replaces_the_earlier_one_whole(tmp_path, bucket):
    store, _ = bucket
    fill(store, "v1")
    first = exported(tmp_path, store)
    assert first["results/a.json"] == b'{"v": "v1"}' and first["evidence/d/1/page.html"] == b"v1 page.html"
    stale = tmp_path / "runs" / RUN / "results" / "gone.json"  # a site the table no longer has
    stale.write_text("{}")

    fill(store, "v2")
    second = exported(tmp_path, store)
    assert set(second) == set(first) and "results/gone.json" not in second
    assert second["results/c.json"] == b'{"v": "v2"}' and second["evidence/d/1/evidence.json"] == b"v2 evidence.json"
    assert sorted(p.name for p in (tmp_path / "runs" / RUN).iterdir()) == ["evidence", "results", "summary.json"]


def test_a_re_export_whose_reads_fail_midway_keeps_the_earlier_results_and_evidence(tmp_path, bucket, caplog):
    store, outage = bucket
    fill(store, "v1")
    before = exported(tmp_path, store)
    (tmp_path / "runs" / RUN / "summary.json").unlink()

    fill(store, "v2")
    outage.arm("GetObject", after=1)  # site a's result is read, b's and everything after fail
    after = exported(tmp_path, store)

    assert after == before  # not one v2, nothing missing
    assert (tmp_path / "runs" / RUN / "summary.json").is_file()  # the summary is the table's: written still
    assert sorted(p.name for p in (tmp_path / "runs" / RUN).iterdir()) == ["evidence", "results", "summary.json"]
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("export-kept-previous")]
    assert len(kept) == 2


def test_evidence_whose_listing_fails_is_kept_while_the_results_are_replaced(tmp_path, bucket):
    store, outage = bucket
    fill(store, "v1")
    before = exported(tmp_path, store)

    fill(store, "v2")
    outage.arm("ListObjectsV2")
    after = exported(tmp_path, store)

    assert after["results/b.json"] == b'{"v": "v2"}'
    assert {k: v for k, v in after.items() if k.startswith("evidence/")} == {
        k: v for k, v in before.items() if k.startswith("evidence/")
    }


def test_a_first_export_with_a_failed_read_keeps_what_it_could_read(tmp_path, bucket):
    store, outage = bucket
    fill(store, "v1")
    outage.arm("GetObject", after=2)  # a and b are read; c and the evidence are not
    got = exported(tmp_path, store)
    assert sorted(got) == ["results/a.json", "results/b.json", "summary.json"]
