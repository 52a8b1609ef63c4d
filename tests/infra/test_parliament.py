"""Every IAM policy document of the stack, linted by parliament: nothing of medium severity or higher but what
is suppressed below, each suppression with its reason, and none that no longer matches a finding.

The documents are those the twin's apply evaluates (tests/infra/conftest.py): the roles' inline and trust
policies, the key policy, the buckets' and the file system's policies, with every reference resolved, as AWS
receives them. parliament reads them with its own copy of AWS's action, resource and condition tables and its
community auditors; it asks nothing of the network, which the lint runs without.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

#: parliament's severities, highest first; a finding of MEDIUM or above must be fixed or suppressed.
SEVERITIES = ("CRITICAL", "HIGH", "MEDIUM", "LOW", "INFO", "MUTE")
BLOCKING = SEVERITIES[: SEVERITIES.index("MEDIUM") + 1]


@dataclass(frozen=True)
class Finding:
    """A finding: parliament's id for it, the policy (`<type>.<name>.<argument>`) and the Sids it is about."""

    issue: str
    policy: str
    statements: tuple[str, ...]
    severity: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Suppressed:
    issue: str
    policy: str
    statements: tuple[str, ...]
    reason: str

    def matches(self, f: Finding) -> bool:
        return (self.issue, self.policy, self.statements) == (f.issue, f.policy, f.statements)


_TRUST = (
    "A trust policy names no Resource (IAM refuses one there: the role it belongs to is its resource); "
    "parliament reads every document as an identity policy."
)
_SPLIT_RUN = (
    "RunInstances is authorized resource by resource: the instance, held to the stack's and the role's tags by "
    "its own conditions, and the image, subnets, group, template, volumes and interfaces it uses are granted in "
    "two statements, as EC2's documentation writes such policies; parliament wants every resource type of the "
    "action in each statement."
)
_SPLIT_COMMAND = (
    "SendCommand is authorized on the document and on each instance: the document in one statement, the "
    "instances (held to ssm:resourceTag conditions) in another; parliament wants both in each."
)
_NO_ACCOUNT = (
    "An AWS-owned resource's ARN has no account (the AWS-RunShellScript document, the public parameters under "
    "/aws/service/); parliament's ARN pattern wants one."
)
_PASS_NODE = (
    "iam:PassRole on the node role alone, to EC2 alone (iam:PassedToService): launching its nodes with their "
    "instance profile is the hub's job."
)
_PASS_HUB = (
    "iam:PassRole on the hub role alone, to EC2 alone (iam:PassedToService): launching the day's hub with its "
    "instance profile is the Lambda's job."
)
_LAUNCH_NODE = (
    "The hub launches nodes that run with the node role: only from the node template, in the private subnets, "
    "with the node group, tagged as the stack's nodes; what the node role holds is what the hub sends its nodes "
    "to do."
)
_LAUNCH_HUB = (
    "The Lambda launches the hub that runs with the hub role: only from the hub template, tagged as the stack's "
    "hub; a Lambda that starts the crawl must be able to start its hub."
)
_LOGS_CONTEXT = (
    "The encryption context key as CloudWatch Logs' documentation writes the key policy for encrypted log "
    "groups (kms:EncryptionContext:aws:logs:arn, an ARN, under ArnLike, with kms:Describe* among the actions); "
    "parliament types the key as a string and knows no such key for DescribeKey."
)

#: parliament's findings of MEDIUM or higher that stand, with why. A row names the finding, the policy and the
#: statements (Sids) it is about; one that matches no finding any more fails the test.
SUPPRESSED = (
    *(
        Suppressed("MALFORMED", f"aws_iam_role.{role}.assume_role_policy", (sid,), _TRUST)
        for role, sid in (
            ("hub", "Ec2AssumesRole"),
            ("node", "Ec2AssumesRole"),
            ("starter", "LambdaAssumesRole"),
            ("watchdog", "LambdaAssumesRole"),
            ("flow_logs", "FlowLogsAssumeRole"),
        )
    ),
    Suppressed("PERMISSIONS_MANAGEMENT_ACTIONS", "aws_iam_role_policy.hub.policy", ("PassNodeRole",), _PASS_NODE),
    Suppressed(
        "PRIVILEGE_ESCALATION",
        "aws_iam_role_policy.hub.policy",
        ("RunNodeInstances", "RunNodeResources", "PassNodeRole"),
        _LAUNCH_NODE,
    ),
    Suppressed("RESOURCE_MISMATCH", "aws_iam_role_policy.hub.policy", ("RunNodeInstances",), _SPLIT_RUN),
    Suppressed("RESOURCE_MISMATCH", "aws_iam_role_policy.hub.policy", ("RunNodeResources",), _SPLIT_RUN),
    Suppressed("RESOURCE_MISMATCH", "aws_iam_role_policy.hub.policy", ("RunShellScriptDocument",), _NO_ACCOUNT),
    Suppressed("RESOURCE_MISMATCH", "aws_iam_role_policy.hub.policy", ("SendCommandToNodes",), _SPLIT_COMMAND),
    Suppressed("RESOURCE_MISMATCH", "aws_iam_role_policy.hub.policy", ("AmiParameter",), _NO_ACCOUNT),
    *(
        row
        for role in ("starter", "watchdog")
        for row in (
            Suppressed(
                "PERMISSIONS_MANAGEMENT_ACTIONS", f"aws_iam_role_policy.{role}.policy", ("PassHubRole",), _PASS_HUB
            ),
            Suppressed(
                "PRIVILEGE_ESCALATION",
                f"aws_iam_role_policy.{role}.policy",
                ("RunHubInstance", "RunHubResources", "PassHubRole"),
                _LAUNCH_HUB,
            ),
            Suppressed("RESOURCE_MISMATCH", f"aws_iam_role_policy.{role}.policy", ("RunHubInstance",), _SPLIT_RUN),
            Suppressed("RESOURCE_MISMATCH", f"aws_iam_role_policy.{role}.policy", ("RunHubResources",), _SPLIT_RUN),
        )
    ),
    Suppressed(
        "PERMISSIONS_MANAGEMENT_ACTIONS",
        "aws_kms_key.main.policy",
        ("AccountAdministersKeyThroughIam", "FleetLaunchersGrantKeyToEbs"),
        "The account administers its key through IAM (kms:* for the account, as KMS's default key policy; "
        "without it the key can become unmanageable); EC2 gets grants for the fleet's volumes only "
        "(kms:GrantIsForAWSResource).",
    ),
    Suppressed(
        "UNKNOWN_CONDITION_FOR_ACTION",
        "aws_kms_key.main.policy",
        ("CloudWatchLogsEncryptsFleetLogGroups",),
        _LOGS_CONTEXT,
    ),
    Suppressed("MISMATCHED_TYPE", "aws_kms_key.main.policy", ("CloudWatchLogsEncryptsFleetLogGroups",), _LOGS_CONTEXT),
)


# --- reading parliament's findings ---------------------------------------------------------------------------


def _parliament():
    """parliament, with its community auditors' findings known (their settings are an override of its config)."""
    import parliament

    parliament.override_config(Path(parliament.__file__).parent / "community_auditors" / "config_override.yaml")
    return parliament


def _statement_lines(text: str) -> list[tuple[int, int]]:
    """The first and last line (1-based) of each statement of a document dumped with indent=2."""
    lines = text.splitlines()
    starts = [i + 1 for i, line in enumerate(lines) if line == "    {"]
    ends = [i + 1 for i, line in enumerate(lines) if line in ("    }", "    },")]
    return list(zip(starts, ends, strict=True))


def _about(location: dict, statements: list[dict], spans: list[tuple[int, int]]) -> tuple[str, ...]:
    """The Sids of the statements a finding is about: the one holding its line, else (a finding about the whole
    document, as the community auditors' are) those granting one of the actions it names."""
    if "line" in location:
        return tuple(statements[i].get("Sid", "") for i, (a, b) in enumerate(spans) if a <= location["line"] <= b)
    named = [a.lower() for a in location.get("actions", [])]
    granting = []
    for st in statements:
        patterns = st.get("Action", [])
        patterns = [patterns] if isinstance(patterns, str) else patterns
        if any(fnmatchcase(a, p.lower()) for a in named for p in patterns):
            granting.append(st.get("Sid", ""))
    return tuple(granting)


def lint(policy: str, document: str) -> list[Finding]:
    """parliament's findings on one document."""
    parliament = _parliament()
    doc = json.loads(document)
    statements = doc["Statement"] if isinstance(doc["Statement"], list) else [doc["Statement"]]
    text = json.dumps({**doc, "Statement": statements}, indent=2)
    spans = _statement_lines(text)
    out = []
    for f in parliament.analyze_policy_string(
        text, ignore_private_auditors=True, include_community_auditors=True
    ).findings:
        parliament.enhance_finding(f)
        about = _about(f.location, statements, spans)
        out.append(Finding(f.issue, policy, about, f.severity, json.dumps(f.detail, default=str)[:300]))
    return out


def unexplained_and_stale(
    findings: list[Finding], suppressed: tuple[Suppressed, ...]
) -> tuple[list[Finding], list[Suppressed]]:
    """The findings of MEDIUM or higher that no row suppresses, and the rows that suppress no finding."""
    blocking = [f for f in findings if f.severity in BLOCKING]
    unexplained = [f for f in blocking if not any(s.matches(f) for s in suppressed)]
    stale = [s for s in suppressed if not any(s.matches(f) for f in blocking)]
    return unexplained, stale


# --- the stack ---------------------------------------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch) -> Iterator[None]:
    """No connection can be opened: a lint that wanted the network would fail, not wait."""

    def refuse(self, address):
        raise OSError(f"the lint runs offline: a connection to {address} was refused")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    yield


@pytest.fixture
def findings(applied, offline) -> list[Finding]:
    return [f for policy, doc in sorted(applied.outputs.policies.items()) for f in lint(policy, doc)]


def test_every_policy_document_of_the_stack_is_linted(applied):
    policies = set(applied.outputs.policies)
    roles = ("hub", "node", "starter", "watchdog", "flow_logs")
    assert {f"aws_iam_role_policy.{r}.policy" for r in roles} <= policies
    assert {f"aws_iam_role.{r}.assume_role_policy" for r in roles} <= policies
    assert {
        "aws_kms_key.main.policy",
        "aws_s3_bucket_policy.results.policy",
        "aws_s3_bucket_policy.access_logs.policy",
        "aws_efs_file_system_policy.main.policy",
    } <= policies
    for policy, doc in applied.outputs.policies.items():
        # every reference resolved; IAM's own variables (${aws:...}) stay for IAM to fill in
        assert re.search(r"\$\{(?!aws:)", doc) is None, f"{policy}: a reference is left unresolved"
        assert json.loads(doc)["Statement"], policy


def test_parliament_finds_nothing_of_medium_severity_or_more_that_is_not_suppressed(findings):
    with pytest.raises(OSError, match="offline"):  # the findings were made with the network closed
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    unexplained, stale = unexplained_and_stale(findings, SUPPRESSED)
    assert unexplained == [], "parliament's findings: fix the policy, or suppress with the reason:\n" + "\n".join(
        f"{f.severity} {f.issue} {f.policy} {f.statements}: {f.detail}" for f in unexplained
    )
    assert stale == [], "suppressions that match no finding any more: remove them:\n" + "\n".join(map(str, stale))


def test_every_suppression_names_a_policy_of_the_stack_and_says_why(applied):
    for s in SUPPRESSED:
        assert s.policy in applied.outputs.policies, s
        assert len(s.reason) > 60 and s.statements and all(s.statements), s
    assert len(set((s.issue, s.policy, s.statements) for s in SUPPRESSED)) == len(SUPPRESSED)


def test_a_policy_that_grants_too_much_is_found_and_a_suppression_without_its_finding_is_stale(offline):
    """The check is not vacuous: every S3 action on everything is a blocking finding that no row suppresses, and
    every row is then stale."""
    wide = {"Sid": "Everything", "Effect": "Allow", "Action": "s3:*", "Resource": "*"}
    found = lint("aws_iam_role_policy.hub.policy", json.dumps({"Version": "2012-10-17", "Statement": [wide]}))
    unexplained, stale = unexplained_and_stale(found, SUPPRESSED)
    assert [(f.issue, f.statements) for f in unexplained] == [("PERMISSIONS_MANAGEMENT_ACTIONS", ("Everything",))]
    assert stale == list(SUPPRESSED)


def test_a_finding_about_the_whole_document_is_placed_by_the_actions_it_names(offline):
    """The community auditors' findings carry no line: the statements granting the actions they name are theirs."""
    doc = {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "Read", "Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"},
            {
                "Sid": "Pass",
                "Effect": "Allow",
                "Action": ["iam:PassRole"],
                "Resource": "arn:aws:iam::123456789012:role/x",
            },
        ],
    }
    found = [f for f in lint("p", json.dumps(doc)) if f.severity in BLOCKING]
    assert [(f.issue, f.statements) for f in found] == [("PERMISSIONS_MANAGEMENT_ACTIONS", ("Pass",))]
