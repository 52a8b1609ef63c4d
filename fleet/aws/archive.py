"""The runs' record in an S3 bucket (`fleet.outputs.archive.RunArchive`): the keys as `fleet.outputs.archive` makes
them."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.outputs.archive import PREFIX, is_summary, report_key, run_id_of, summary_key

log = logging.getLogger("gridfleet")

#: A summary larger than this is not read back (a run of 100,000 sites is far below it).
MAX_SUMMARY_BYTES = 256 * 1024 * 1024


class S3RunArchive:
    def __init__(self, client: Any, bucket: str):
        self._c = client
        self.bucket = bucket

    def put_summary(self, summary: Mapping[str, Any]) -> str:
        key = summary_key(str(summary["run_id"]))
        self._c.put_object(
            Bucket=self.bucket, Key=key, Body=json.dumps(summary, indent=1).encode(), ContentType="application/json"
        )
        return key

    def put_report(self, run_id: str, html: str) -> str:
        key = report_key(run_id)
        self._c.put_object(Bucket=self.bucket, Key=key, Body=html.encode(), ContentType="text/html; charset=utf-8")
        return key

    def get_summary(self, run_id: str) -> dict[str, Any] | None:
        try:
            obj = self._c.get_object(Bucket=self.bucket, Key=summary_key(run_id))
        except ClientError as e:
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        if int(obj.get("ContentLength") or 0) > MAX_SUMMARY_BYTES:
            log.warning("archived summary of run %s is too large to read (%s bytes)", run_id, obj["ContentLength"])
            return None
        try:
            data = json.loads(obj["Body"].read())
        except ValueError:
            log.warning("archived summary of run %s is not JSON", run_id)
            return None
        return data if is_summary(data) and data["run_id"] == run_id else None

    def summaries(self) -> list[tuple[float, str]]:
        out = []
        for page in self._c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=PREFIX):
            for o in page.get("Contents", []):
                run_id = run_id_of(o["Key"])
                if run_id is not None:
                    out.append((o["LastModified"].timestamp(), run_id))
        return sorted(out)
