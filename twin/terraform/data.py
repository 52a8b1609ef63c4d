"""The data sources infra/terraform reads, as the twin reads them on moto.

The caller identity and partition are moto's. The AMI parameter is read from moto's SSM; AWS publishes it and
moto does not, so the caller's `ami_id` stands in when it is absent. The AMI is looked up among moto's images.
A policy document is rendered as the AWS provider renders it. The Lambda package object is read from the
bucket, and when the bucket has none the given package (a placeholder by default) is put there first: the twin
calls the handlers in this process, so the package is never run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from twin.terraform.expressions import TfError, Where
from twin.terraform.launch import placeholder_package
from twin.terraform.resources import ClientSource, Ctx


def _one_or_list(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else values


_STATEMENT_KEYS = frozenset(
    {"sid", "effect", "actions", "not_actions", "resources", "not_resources", "principals", "condition"}
)
_DOCUMENT_KEYS = frozenset({"statement", "version", "source_policy_documents"})


def policy_document(args: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An aws_iam_policy_document's JSON, as the AWS provider writes it (one value alone, not in a list): the
    statements of its `source_policy_documents` first, in order, then its own, one of which with a source
    statement's Sid takes that statement's place."""
    if set(args) - _DOCUMENT_KEYS:
        raise TfError(f"{where}: arguments the twin does not render: {', '.join(sorted(set(args) - _DOCUMENT_KEYS))}")
    merged = _sourced(args.get("source_policy_documents") or [], where)
    for out in _statements(args.get("statement", []), where):
        at = next((i for i, s in enumerate(merged) if out.get("Sid") and s.get("Sid") == out["Sid"]), None)
        if at is None:
            merged.append(out)
        else:
            merged[at] = out
    doc = {"Version": args.get("version") or "2012-10-17", "Statement": merged}
    return {"json": json.dumps(doc, indent=2), "minified_json": json.dumps(doc, separators=(",", ":"))}


def _sourced(sources: list[str], where: str) -> list[dict[str, Any]]:
    """The statements of the source documents, in order; a Sid two of them share is refused, as the provider does."""
    out: list[dict[str, Any]] = []
    for source in sources:
        statements = json.loads(source)["Statement"]
        for st in statements if isinstance(statements, list) else [statements]:
            if st.get("Sid") and any(s.get("Sid") == st["Sid"] for s in out):
                raise TfError(f"{where}: source_policy_documents: found duplicate sid {st['Sid']}")
            out.append(st)
    return out


def _statements(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The document's own statement blocks, as JSON statements."""
    statements = []
    for st in blocks:
        unknown = set(st) - _STATEMENT_KEYS
        if unknown:
            raise TfError(f"{where}: statement arguments the twin does not render: {', '.join(sorted(unknown))}")
        out: dict[str, Any] = {"Sid": st["sid"]} if st.get("sid") else {}
        out["Effect"] = st.get("effect") or "Allow"
        for key, member in (("actions", "Action"), ("not_actions", "NotAction")):
            if st.get(key):
                out[member] = _one_or_list(st[key])
        for key, member in (("resources", "Resource"), ("not_resources", "NotResource")):
            if st.get(key):
                out[member] = _one_or_list(st[key])
        for p in st.get("principals", []):
            if p["type"] == "*" and p["identifiers"] == ["*"]:
                out["Principal"] = "*"
            else:
                out.setdefault("Principal", {})[p["type"]] = _one_or_list(p["identifiers"])
        for c in st.get("condition", []):
            out.setdefault("Condition", {}).setdefault(c["test"], {})[c["variable"]] = _one_or_list(c["values"])
        statements.append(out)
    return statements


@dataclass
class DataReader:
    """`read_<type>(args, where)` gives the attributes of one data source of that type."""

    clients: ClientSource
    ctx: Ctx
    ami_id: str | None = None
    package: bytes | None = None

    def read_aws_caller_identity(self, args: dict[str, Any], where: Where) -> dict[str, Any]:
        return {"account_id": self.ctx.account_id, "id": self.ctx.account_id}

    def read_aws_partition(self, args: dict[str, Any], where: Where) -> dict[str, Any]:
        return {"partition": self.ctx.partition, "dns_suffix": "amazonaws.com", "id": self.ctx.partition}

    def read_aws_iam_policy_document(self, args: dict[str, Any], where: Where) -> dict[str, Any]:
        return policy_document(args, f"{where.file}: {where.block}")

    def read_aws_ssm_parameter(self, args: dict[str, Any], where: Where) -> dict[str, Any]:
        try:
            value = self.clients.client("ssm").get_parameter(Name=args["name"])["Parameter"]["Value"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ParameterNotFound" or not self.ami_id:
                raise TfError(
                    f"{where.file}: {where.block}: parameter {args['name']} is not on the endpoint; give ami_id"
                ) from None
            value = self.ami_id
        return {"value": value, "insecure_value": value, "id": args["name"]}

    def read_aws_ami(self, args: dict[str, Any], where: Where) -> dict[str, Any]:
        filters = [{"Name": f["name"], "Values": f["values"]} for f in args.get("filter", [])]
        images = self.clients.client("ec2").describe_images(Filters=filters)["Images"]
        if not images:
            raise TfError(f"{where.file}: {where.block}: no image matches {filters}")
        image = max(images, key=lambda i: i.get("CreationDate", ""))
        return {"id": image["ImageId"], "image_id": image["ImageId"], "root_device_name": image["RootDeviceName"]}

    def read_aws_s3_object(self, args: dict[str, Any], where: Where) -> dict[str, Any]:
        s3 = self.clients.client("s3")
        try:
            head = s3.head_object(Bucket=args["bucket"], Key=args["key"])
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey"):
                raise
            s3.put_object(Bucket=args["bucket"], Key=args["key"], Body=self.package or placeholder_package())
            head = s3.head_object(Bucket=args["bucket"], Key=args["key"])
        return {"version_id": head.get("VersionId"), "etag": head["ETag"], "content_length": head["ContentLength"]}
