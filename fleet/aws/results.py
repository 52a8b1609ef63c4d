"""The result store on S3: `s3://<bucket>/<key>`, the keys as `fleet.outputs.results` makes them.

`put_new` writes with `IfNoneMatch="*"`: of two writers (a zombie node and the
attempt that replaced it) exactly one result lands and nothing is overwritten.
Results and evidence carry `RESULT_TAG`, which the bucket's expiry rule
selects them by; what nodes write (under `staging/`: `fleet.outputs.results`) carries
no tag, and the bucket's rule for that prefix expires it. The page's HTML in evidence is
stored as plain text to download (`fleet.outputs.results.evidence_headers`), never as
a page of the bucket's origin.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.errors import MissingResource, quote
from fleet.outputs.results import (
    EXISTED,
    MISSING,
    PROMOTED,
    RESULT_MAX_BYTES,
    TOO_LARGE,
    WRITER_RE,
    aside_key,
    evidence_headers,
    is_result_key,
    writer_node,
)

#: Every result carries this tag: the bucket's expiry rule selects results by it (results share no key prefix,
#: and the bundle and configs live in the same bucket).
RESULT_TAG = "gridfleet=result"


def node_role_id(iam: Any, instance_profile: str | None) -> str:
    """The unique id of the nodes' role (the role of `instance_profile`): the first half of every node's writer id,
    its `aws:userid` (`fleet.outputs.results.writer_id`). MissingResource when there is no such profile or role."""
    if not instance_profile:
        raise MissingResource("aws.instance_profile is not set: the hub cannot tell whose prefix a node writes under")
    try:
        roles = iam.get_instance_profile(InstanceProfileName=instance_profile)["InstanceProfile"]["Roles"]
    except ClientError as e:
        if error_code(e) == "NoSuchEntity":
            raise MissingResource(f"instance profile {instance_profile!r} does not exist") from None
        raise
    if not roles or WRITER_RE.fullmatch(f"{roles[0].get('RoleId', '')}:i-0") is None:
        raise MissingResource(f"instance profile {instance_profile!r} has no role")
    return str(roles[0]["RoleId"])


def own_writer(sts: Any, instance_id: str) -> str:
    """This node's writer id: its credentials' `aws:userid` (STS GetCallerIdentity, which needs no permission), which
    for an instance's role is `<role id>:<instance id>`. MissingResource when they are not this instance's."""
    user = str(sts.get_caller_identity().get("UserId", ""))
    if writer_node(user) != instance_id:
        raise MissingResource(
            f"this node's credentials are not its instance's role session (aws:userid {quote(user)}): "
            f"it could write nowhere it may ({instance_id} writes under staging/<role id>:{instance_id}/)"
        )
    return user


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

    def put_staged(self, key: str, body: bytes, content_type: str = "application/json") -> bool:
        """A node's write under its own prefix: a new object only, untagged (the bucket's rule for `staging/`
        expires it), of the type the node says (the hub stores again what it serves: `promote`, `put_evidence`)."""
        try:
            self._c.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*", ContentType=content_type)
            return True
        except ClientError as e:
            if error_code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise

    def promote(self, staged: str, key: str) -> str:
        """The hub's copy of a staged result to its key, within S3 (no byte through the hub): the copy is of the
        object as it was looked at (CopySourceIfMatch), never over a result (IfNoneMatch; looked at first too, as
        moto's CopyObject does not honour it), with the result's type and tag, whatever the node wrote."""
        if not is_result_key(key):
            raise ValueError(f"{key!r} is not a result's key: nothing promoted to it")
        try:
            head = self._c.head_object(Bucket=self.bucket, Key=staged)
        except ClientError as e:
            if error_code(e) in ("404", "NoSuchKey", "NotFound"):
                return MISSING
            raise
        if int(head.get("ContentLength", 0)) > RESULT_MAX_BYTES:
            return TOO_LARGE
        if self.exists(key):
            return EXISTED
        try:
            self._c.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": staged},
                CopySourceIfMatch=head["ETag"],
                IfNoneMatch="*",
                MetadataDirective="REPLACE",
                ContentType="application/json",
                TaggingDirective="REPLACE",
                Tagging=RESULT_TAG,
            )
        except ClientError as e:
            if error_code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
                return EXISTED if self.exists(key) else MISSING
            raise
        return PROMOTED

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
