"""What a compromised node can do (docs/architecture/compromised-node.md), row by row where IAM
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


#: The node's `aws:userid`, as IAM puts it in the context of a request signed with its instance role's credentials:
#: `<role id>:<instance id>`; what it may write in the bucket is named by it.
ME = "AROANODEROLE0000:i-0123456789abcdef0"
OTHER = "AROANODEROLE0000:i-0fedcba987654321f"


def s3(node, action: str, key: str, **context: str) -> str:
    statements, _, bucket = node
    return decide(statements, Request(action, f"{bucket}/{key}", {**TLS, "aws:userid": ME, **context}))


NEW = {"s3:if-none-match": "*"}


def test_it_can_write_its_own_attempts_attributes(node):
    fence = {"version": 4, "attemptCount": 1, "instance_id": "i-1"}
    assert update(node, (RUN, "a"), **fence, heartbeatEpoch=1.0) == ALLOW  # beat
    assert update(node, (RUN, "a"), **fence, site_status="URL_CALL", url="u", pages=2, checkpoint="c") == ALLOW
    saved = {"site_status": "SAVED", "staged": 5, "attempts": [], "items": 30, "pages": 3}
    assert update(node, (RUN, "a"), **fence, **saved) == ALLOW  # its result staged, with its counts
    end = {"run_status": "QUEUED", "failure_reason": "error", "attempts": [], "error": "x"}
    assert update(node, (RUN, "a"), **fence, **end) == ALLOW  # an attempt it ended
    assert update(node, (RUN, "#node#i-1"), node_state="busy", site="a", attempt=1, stats={}) == ALLOW  # node item


def test_it_cannot_write_another_sites_spec(node):
    """Nor its own: IAM cannot tell the site a node holds, so no node writes any spec, mark or rerun base."""
    assert update(node, (RUN, "b"), spec={"start_url": "https://evil.example/"}) == IMPLICIT_DENY
    assert update(node, (RUN, "b"), version=5, spec={}) == IMPLICIT_DENY  # one forbidden name spoils the request
    assert update(node, (RUN, "b"), mark=["x"]) == IMPLICIT_DENY
    assert update(node, (RUN, "b"), attemptBase=9) == IMPLICIT_DENY
    assert put_item(node, {"run_id": RUN, "Site": "b", "run_status": "QUEUED"}) == IMPLICIT_DENY  # a whole item


def test_the_hubs_marks_and_expiries_are_no_nodes_to_write_on_any_item(node):
    """The kill mark, a result's key and any item's expiry: a node names none of them in any write, so none is in
    its policy, on any item (the hub stamps the run's node items with their expiry when the run ends)."""
    for name, value in {"kill_reason": "hang", "result_key": "hub/fleet.yaml", "expireAt": 0}.items():
        assert update(node, (RUN, "b"), **{name: value}) == IMPLICIT_DENY, name
        assert update(node, (RUN, "#node#i-1"), **{name: value}) == IMPLICIT_DENY, name
    for name in ("state", "started_at"):  # the run item's names: a node item's are node_state and booted_at
        assert update(node, (RUN, "#node#i-1"), **{name: "x"}) == IMPLICIT_DENY, name


def test_it_cannot_write_the_run_item_the_index_of_runs_or_the_history(node):
    """They live in partitions a node may write no item of (`dynamodb:LeadingKeys`), whatever the attributes: the
    run item and history in `#run:<run id>`, the index in `#runs`; the marks' `#sites` takes only whole marks."""
    for partition, key in ((f"#run:{RUN}", "#run"), (f"#run:{RUN}", "#h#0001#000001"), ("#runs", RUN)):
        for name in ("heartbeatEpoch", "attempts", "site_status", "node_state"):  # names it may write elsewhere
            assert update(node, (partition, key), **{name: "x"}) == IMPLICIT_DENY, (partition, name)
    assert update(node, ("#runs", "another-run"), heartbeatEpoch=1) == IMPLICIT_DENY  # no index entry of its making
    assert update(node, ("#sites", "b"), heartbeatEpoch=1) == IMPLICIT_DENY
    assert put_item(node, {"run_id": f"#run:{RUN}", "Site": "#run", "status": "RUNNING"}) == IMPLICIT_DENY
    assert update(node, (RUN, "#run"), heartbeatEpoch=1) == ALLOW  # an item of that key in the run's partition is
    assert update(node, ("#limits", "g"), next_at=1) == ALLOW  # no run item: a junk item the hub's reads leave out
    assert update(node, (f"#pacing:{RUN}", "d"), requests=1) == ALLOW


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
    assert s3(node, "s3:GetObject", f"staging/{OTHER}/b/{DATE}/evidence/1/page.html") == IMPLICIT_DENY


def test_it_can_read_results_and_every_nodes_checkpoint_parts(node):
    """A node looks for its own result (HeadObject, authorized as GetObject) and IAM cannot tell its site from
    another's: results are readable, as the checkpoint parts a retry resumes from are, whichever node wrote them."""
    assert s3(node, "s3:GetObject", f"b/{DATE}/result.json") == ALLOW
    assert s3(node, "s3:GetObject", f"staging/{OTHER}/b/{DATE}/parts/1-3/000001.json") == ALLOW
    assert s3(node, "s3:GetObject", f"staging/{OTHER}/b/{DATE}/result/1-3.json") == IMPLICIT_DENY


def test_it_writes_no_result_only_its_own_staged_one(node):
    """No result, new or not, at any key a reader takes one from: the hub copies a staged result there. A staged
    one only under its own prefix (its `aws:userid`), and only as a new object."""
    for key in (f"b/{DATE}/result.json", f"b/{DATE}/{RUN}/result.json"):
        assert s3(node, "s3:PutObject", key, **NEW) == IMPLICIT_DENY, key
        assert s3(node, "s3:PutObject", key) == IMPLICIT_DENY, key
    mine, theirs = f"staging/{ME}/b/{DATE}/result/1-3.json", f"staging/{OTHER}/b/{DATE}/result/1-3.json"
    assert s3(node, "s3:PutObject", mine, **NEW) == ALLOW
    assert s3(node, "s3:PutObject", mine) == IMPLICIT_DENY  # replacing what it staged
    assert s3(node, "s3:PutObject", mine, **{"s3:if-none-match": "a-etag"}) == IMPLICIT_DENY
    assert s3(node, "s3:PutObject", theirs, **NEW) == IMPLICIT_DENY
    assert s3(node, "s3:DeleteObject", mine) == IMPLICIT_DENY
    bare = decide(node[0], Request("s3:PutObject", f"{node[2]}/{mine}", {**TLS, **NEW}))  # no aws:userid at all
    assert bare == IMPLICIT_DENY


def test_its_parts_evidence_and_quarantine_are_new_objects_under_its_own_prefix_and_untagged(node):
    for folder in ("parts/1-3/000001.json", "evidence/1/page.html", "quarantine/1.json"):
        mine, theirs, beside = (
            f"staging/{ME}/b/{DATE}/{folder}",
            f"staging/{OTHER}/b/{DATE}/{folder}",
            f"b/{DATE}/{folder}",
        )
        assert s3(node, "s3:PutObject", mine, **NEW) == ALLOW, folder
        assert s3(node, "s3:PutObject", mine) == IMPLICIT_DENY, folder  # never replaced, a part included
        assert s3(node, "s3:PutObject", theirs, **NEW) == IMPLICIT_DENY, folder
        assert s3(node, "s3:PutObject", beside, **NEW) == IMPLICIT_DENY, folder  # where the hub's copy goes
        assert s3(node, "s3:PutObjectTagging", mine) == IMPLICIT_DENY, folder  # no tag to move its expiry
        assert s3(node, "s3:PutObjectTagging", f"b/{DATE}/result.json") == IMPLICIT_DENY
    for key in ("bundle/gridfleet-bundle.tar.gz", "hub/fleet.yaml", f"runs/{RUN}/fleet.yaml"):
        assert s3(node, "s3:PutObject", key, **NEW) == IMPLICIT_DENY, key


def test_the_buckets_own_policy_refuses_a_request_without_tls(node):
    assert s3(node, "s3:GetObject", "bundle/gridfleet-bundle.tar.gz", **{"aws:SecureTransport": "false"}) == DENY


def test_it_mounts_the_stacks_file_system_only_through_an_access_point(applied, node):
    """A node mounts through an access point only, as the crawl user (every site's has that POSIX user): IAM cannot
    tell one site's access point from another's (ClientMount has no tag condition key), so "its own" and "another
    site's" are the same request; the node's root helper mounts only a site the node holds (docs)."""
    statements = node[0]
    fs = applied.clients.client("efs").describe_file_systems(FileSystemId=applied.outputs.efs_id)["FileSystems"][0]
    arn = (
        fs.get("FileSystemArn")
        or f"arn:aws:elasticfilesystem:ap-northeast-2:123456789012:file-system/{fs['FileSystemId']}"
    )
    mine = arn.replace(f"file-system/{fs['FileSystemId']}", "access-point/fsap-0123456789abcdef0")
    other = arn.replace(f"file-system/{fs['FileSystemId']}", "access-point/fsap-0fedcba987654321f")
    for point in (mine, other):
        through = {"elasticfilesystem:AccessPointArn": point}
        assert decide(statements, Request("elasticfilesystem:ClientMount", arn, through)) == ALLOW
        assert decide(statements, Request("elasticfilesystem:ClientWrite", arn, through)) == ALLOW
        assert decide(statements, Request("elasticfilesystem:ClientRootAccess", arn, through)) == IMPLICIT_DENY
    assert decide(statements, Request("elasticfilesystem:ClientMount", arn, {})) == IMPLICIT_DENY  # the root
    another_fs = arn.replace(fs["FileSystemId"], "fs-0fedcba987654321f")
    assert decide(statements, Request("elasticfilesystem:ClientMount", another_fs, through)) == IMPLICIT_DENY
    for action in ("CreateAccessPoint", "TagResource", "DeleteAccessPoint"):  # it makes and changes none
        assert decide(statements, Request(f"elasticfilesystem:{action}", arn, {})) == IMPLICIT_DENY
