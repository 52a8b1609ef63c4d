"""What a compromised node can do (docs/ARCHITECTURE.md, "What a compromised node can do"), row by row where IAM
decides it: a web page that escaped Chromium holds the node's instance-profile credentials and may send any request
they sign, so each test sends the request the real call would carry (action, resource ARN, condition keys) through
tests/helpers/iam_eval.py. moto evaluates no IAM, so the evaluator is the seam: it reads the node role's policy and
the bucket's policy as the twin's apply of infra/terraform resolves them (tests/infra/conftest.py), as AWS receives
them.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.iam_eval import ALLOW, DENY, IMPLICIT_DENY, Request, decide, dynamodb_context, from_document

RUN, DATE = "2026-11-21", "20261121"
TLS = {"aws:SecureTransport": "true"}


@pytest.fixture(scope="module")
def node(applied):
    """The node role's inline policy and the results bucket's policy (its Deny statements bind the node too), and
    the ARNs of the stack's table and bucket."""
    policies = applied.outputs.policies
    statements = from_document(json.loads(policies["aws_iam_role_policy.node.policy"]))
    bucket = applied.outputs.bucket
    statements += [
        st for st in from_document(json.loads(policies["aws_s3_bucket_policy.results.policy"])) if st.effect == "Deny"
    ]
    table_arn = applied.clients.client("dynamodb").describe_table(TableName=applied.outputs.table)["Table"]["TableArn"]
    return statements, table_arn, f"arn:aws:s3:::{bucket}"


def update(node, key: tuple[str, str], **values: object) -> str:
    """UpdateItem of `key` setting `values`, as fleet.aws.table writes it: every name through a placeholder."""
    statements, table, _ = node
    names = {f"#a{n}": k for n, k in enumerate(values)}
    params = {
        "Key": {"run_id": {"S": key[0]}, "Site": {"S": key[1]}},
        "UpdateExpression": "SET " + ", ".join(f"{n} = :{n[1:]}" for n in names),
        "ExpressionAttributeNames": names,
    }
    return decide(statements, Request("dynamodb:UpdateItem", table, dynamodb_context(params)))


def put_item(node, item: dict[str, object]) -> str:
    statements, table, _ = node
    params = {"Item": {k: {"S": str(v)} for k, v in item.items()}}
    return decide(statements, Request("dynamodb:PutItem", table, dynamodb_context(params)))


def s3(node, action: str, key: str, **context: str) -> str:
    statements, _, bucket = node
    return decide(statements, Request(action, f"{bucket}/{key}", {**TLS, **context}))


def test_it_can_write_its_own_attempts_attributes(node):
    fence = {"version": 4, "attemptCount": 1, "instance_id": "i-1"}
    assert update(node, (RUN, "a"), **fence, heartbeatEpoch=1.0) == ALLOW  # beat
    assert update(node, (RUN, "a"), **fence, site_status="URL_CALL", url="u", pages=2, checkpoint="c") == ALLOW
    end = {"run_status": "COMPLETED", "result_key": "k", "attempts": [], "items": 30, "pages": 3}
    assert update(node, (RUN, "a"), **fence, **end) == ALLOW  # the end, with its result's counts
    assert update(node, (RUN, "#node#i-1"), state="busy", site="a", attempt=1, stats={}) == ALLOW  # its node item


def test_it_cannot_write_another_sites_spec(node):
    """Nor its own: IAM cannot tell the site a node holds, so no node writes any spec, mark or rerun base."""
    assert update(node, (RUN, "b"), spec={"start_url": "https://evil.example/"}) == IMPLICIT_DENY
    assert update(node, (RUN, "b"), version=5, spec={}) == IMPLICIT_DENY  # one forbidden name spoils the request
    assert update(node, (RUN, "b"), mark=["x"]) == IMPLICIT_DENY
    assert update(node, (RUN, "b"), attemptBase=9) == IMPLICIT_DENY
    assert put_item(node, {"run_id": RUN, "Site": "b", "run_status": "QUEUED"}) == IMPLICIT_DENY  # a whole item


def test_it_cannot_write_the_run_item(node):
    for name, value in {"status": "FINISHED", "deadline_at": 1, "hub_id": "x", "run_date": "x", "reruns": 1}.items():
        assert update(node, (RUN, "#run"), **{name: value}) == IMPLICIT_DENY, name
    assert put_item(node, {"run_id": RUN, "Site": "#run", "status": "RUNNING"}) == IMPLICIT_DENY


def test_but_the_names_a_node_item_shares_with_the_run_item_stay_writable_there(node):
    """What is left (docs): IAM's attribute condition is by name, and a node item has `started_at` and `expireAt`,
    which the run item has too; no condition key names the sort key, so a node can set these two on any item."""
    assert update(node, (RUN, "#run"), started_at=0) == ALLOW
    assert update(node, (RUN, "#run"), expireAt=0) == ALLOW


def test_it_can_put_only_high_water_marks_as_whole_items(node):
    assert put_item(node, {"run_id": "#sites", "Site": "b", "mark": "x", "run": RUN, "at": 1}) == ALLOW
    assert put_item(node, {"run_id": "#sites", "Site": "b", "mark": "x", "spec": "y"}) == IMPLICIT_DENY


def test_it_can_read_the_bundle_and_its_runs_config(node):
    assert s3(node, "s3:GetObject", "bundle/gridfleet-bundle.tar.gz") == ALLOW
    assert s3(node, "s3:GetObject", "bundle/amazon-efs-utils.deb") == ALLOW
    assert s3(node, "s3:GetObject", f"runs/{RUN}/fleet.yaml") == ALLOW


def test_it_cannot_read_the_hubs_config(node):
    assert s3(node, "s3:GetObject", "hub/fleet.yaml") == IMPLICIT_DENY
    assert s3(node, "s3:GetObject", "config/fleet.yaml") == IMPLICIT_DENY  # where it was
    assert s3(node, "s3:GetObject", f"runs/{RUN}/summary.json") == IMPLICIT_DENY
    assert s3(node, "s3:GetObject", f"b/{DATE}/evidence/1/page.html") == IMPLICIT_DENY


def test_it_can_read_another_sites_result(node):
    """A node looks for its own result (HeadObject, authorized as GetObject) and IAM cannot tell its site from
    another's: results are readable, as the checkpoint parts a retry resumes from are."""
    assert s3(node, "s3:GetObject", f"b/{DATE}/result.json") == ALLOW
    assert s3(node, "s3:GetObject", f"b/{DATE}/parts/1-3/000001.json") == ALLOW


def test_it_cannot_overwrite_an_existing_result(node):
    """A put without If-None-Match is refused by IAM; one with it is refused by S3 when the key exists
    (PreconditionFailed: fleet.aws.results.put_new, tests/adapter/test_contract.py)."""
    assert s3(node, "s3:PutObject", f"b/{DATE}/result.json") == IMPLICIT_DENY
    assert s3(node, "s3:PutObject", f"b/{DATE}/result.json", **{"s3:if-none-match": "a-etag"}) == IMPLICIT_DENY
    assert s3(node, "s3:DeleteObject", f"b/{DATE}/result.json") == IMPLICIT_DENY


def test_it_can_create_a_new_result(node):
    """Any site's, not only its own: a result put first makes that site `skipped` (docs: what is left)."""
    assert s3(node, "s3:PutObject", f"b/{DATE}/result.json", **{"s3:if-none-match": "*"}) == ALLOW


def test_it_can_quarantine_a_result_only_as_a_new_object_and_never_read_one(node):
    """A result that broke its contract is kept beside the result (fleet.results.quarantine_key), as results are."""
    key = f"b/{DATE}/quarantine/1.json"
    assert s3(node, "s3:PutObject", key, **{"s3:if-none-match": "*"}) == ALLOW
    assert s3(node, "s3:PutObjectTagging", key) == ALLOW
    assert s3(node, "s3:PutObject", key) == IMPLICIT_DENY
    assert s3(node, "s3:GetObject", key) == IMPLICIT_DENY
    assert s3(node, "s3:DeleteObject", key) == IMPLICIT_DENY


def test_it_can_replace_evidence_and_checkpoint_parts_but_nothing_else(node):
    assert s3(node, "s3:PutObject", f"b/{DATE}/parts/1-3/000001.json") == ALLOW
    assert s3(node, "s3:PutObject", f"b/{DATE}/evidence/1/page.html") == ALLOW
    for key in ("bundle/gridfleet-bundle.tar.gz", "hub/fleet.yaml", f"runs/{RUN}/fleet.yaml"):
        assert s3(node, "s3:PutObject", key, **{"s3:if-none-match": "*"}) == IMPLICIT_DENY, key


def test_the_buckets_own_policy_refuses_a_request_without_tls(node):
    assert s3(node, "s3:GetObject", "bundle/gridfleet-bundle.tar.gz", **{"aws:SecureTransport": "false"}) == DENY


def test_it_mounts_the_shared_file_system_only_through_the_access_point(applied, node):
    """Every node mounts the one access point, as the crawl user: IAM does not split EFS by site (docs)."""
    statements = node[0]
    fs = applied.clients.client("efs").describe_file_systems(FileSystemId=applied.outputs.efs_id)["FileSystems"][0]
    point = applied.outputs.efs_access_point_id
    arn = (
        fs.get("FileSystemArn")
        or f"arn:aws:elasticfilesystem:ap-northeast-2:123456789012:file-system/{fs['FileSystemId']}"
    )
    access_point = arn.replace(f"file-system/{fs['FileSystemId']}", f"access-point/{point}")
    through = {"elasticfilesystem:AccessPointArn": access_point}
    assert decide(statements, Request("elasticfilesystem:ClientMount", arn, through)) == ALLOW
    assert decide(statements, Request("elasticfilesystem:ClientMount", arn, {})) == IMPLICIT_DENY
    assert decide(statements, Request("elasticfilesystem:ClientRootAccess", arn, through)) == IMPLICIT_DENY
