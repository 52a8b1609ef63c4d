"""The result store on S3: `s3://<bucket>/<key>`, the keys as `fleet.results` makes them.

`put_new` writes with `IfNoneMatch="*"`: of two writers (a zombie node and the
attempt that replaced it) exactly one result lands and nothing is overwritten.
Results and evidence carry `RESULT_TAG`, checkpoint parts `PART_TAG`: the
bucket's expiry rules select objects by them. The page's HTML in evidence is
stored as plain text to download (`fleet.results.evidence_headers`), never as
a page of the bucket's origin.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.errors import MissingResource
from fleet.results import aside_key, evidence_headers, is_result_key

#: Every result carries this tag: the bucket's expiry rule selects results by it (results share no key prefix,
#: and the bundle and configs live in the same bucket).
RESULT_TAG = "gridfleet=result"
#: Every checkpoint part carries this tag: parts are needed only while their run lasts, and expire sooner.
PART_TAG = "gridfleet=part"


class S3ResultStore:
    def __init__(self, client: Any, bucket: str):
        self._c = client
        self.bucket = bucket

    def check_exists(self) -> None:
        try:
            self._c.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            if error_code(e) in ("404", "NoSuchBucket", "NotFound"):
                raise MissingResource(f"S3 bucket {self.bucket!r} does not exist") from None
            raise

    def exists(self, key: str) -> bool:
        try:
            self._c.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as e:
            if error_code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def put_new(self, key: str, body: bytes) -> bool:
        """Write `body` unless the key exists; True if this call wrote it."""
        try:
            self._c.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                IfNoneMatch="*",
                ContentType="application/json",
                Tagging=RESULT_TAG,
            )
            return True
        except ClientError as e:
            if error_code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise

    def put_evidence(self, key: str, body: bytes, content_type: str) -> None:
        # Tagged as a result: the bucket's expiry rule takes evidence with the results it explains.
        headers = evidence_headers(key, content_type)
        self._c.put_object(Bucket=self.bucket, Key=key, Body=body, Tagging=RESULT_TAG, **headers)

    def put_part(self, key: str, body: bytes) -> None:
        self._c.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", Tagging=PART_TAG)

    def get(self, key: str) -> bytes:
        return self._c.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def set_aside(self, key: str, suffix: str) -> str | None:
        if not is_result_key(key):  # it copies and deletes with the operator's credentials: results only
            raise ValueError(f"{key!r} is not a result's key: not set aside")
        if not self.exists(key):
            return None
        new = aside_key(key, suffix)
        self._c.copy_object(
            Bucket=self.bucket, Key=new, CopySource={"Bucket": self.bucket, "Key": key}, TaggingDirective="COPY"
        )
        self._c.delete_object(Bucket=self.bucket, Key=key)
        return new

    def keys(self, prefix: str) -> list[str]:
        out: list[str] = []
        for page in self._c.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(out)
