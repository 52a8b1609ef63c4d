"""What a node taken over by a web page can write into the state table, drawn at random (hypothesis).

The node role may UpdateItem many attributes of the items of the partitions it may write, and PutItem whole high-water
marks (infra/terraform, the node's policy): such a node can put a value of any DynamoDB type into any of those
attributes, under any key of those partitions, item there or not. `writes()` draws such requests; each is judged by
the node role's policy as the twin's apply renders it (`node_policy`, through tests/helpers/iam_eval), and only those
IAM would allow are sent: the seam is the evaluator, since moto judges no IAM.

What the fuzz leaves out of the honest sites' records, and why: their status, fence and index key (`run_status`,
`site_status`, `version`, `attemptCount`, `instance_id`, `enqueued`, `openSite`, `staged`, `receipt`), and a history a
reader can take as one (`forged_history`). A node may write them (IAM cannot tell the site a node holds), and then it
ends or takes over that site's attempt, or rewrites its history, by design: no reading can tell that write from the
holder's own (`gridfleet check` catches a history that does not add up). That is a row of the table of what a
compromised node can do (docs/architecture/compromised-node.md), shown by its own tests (a record whose fence cannot
be read is repaired, a completion no hub made is undone); the fuzz holds that nothing else a node writes stops the
run or changes an honest site's end.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from tests.helpers.iam_eval import ALLOW, Request, Statement, decide, dynamodb_context, from_document

#: The attributes the fuzz does not write on an honest site (see the module's docstring).
DECISIONS = frozenset(
    {"run_status", "site_status", "version", "attemptCount", "instance_id", "enqueued", "openSite", "staged", "receipt"}
)
#: Names outside the node's policy, which the fuzz tries too: IAM must refuse each.
HUB_ONLY = ("spec", "kill_reason", "expireAt", "result_key", "status", "started_at", "state", "attemptBase", "mark")

_TEXT = st.text(string.printable + "é\u2028\x00", max_size=40) | st.sampled_from(["x" * 3000, "z:" + "A" * 500])
_NUMBER = (
    st.integers(-(10**30), 10**30).map(Decimal)
    | st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-1e12, max_value=1e12)
    | st.sampled_from([Decimal("1E+125"), Decimal("-1E-130"), Decimal("0.000"), Decimal(2**63)])
)
_SCALAR = (
    _TEXT
    | _NUMBER
    | st.binary(max_size=64)
    | st.booleans()
    | st.none()
    | st.frozensets(st.text(min_size=1, max_size=8), min_size=1, max_size=4).map(set)
    | st.frozensets(st.integers(-5, 5).map(Decimal), min_size=1, max_size=4).map(set)
    | st.frozensets(st.binary(min_size=1, max_size=4), min_size=1, max_size=3).map(set)
)
#: A value of any DynamoDB type (S, N, B, BOOL, NULL, SS, NS, BS, L, M), nested a few levels, as boto3 writes them.
VALUES = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(min_size=1, max_size=12), inner, max_size=4),
    max_leaves=6,
)


@dataclass(frozen=True)
class Write:
    """One request a node could send: UpdateItem (SET of `values`) or PutItem (`put`: the whole item)."""

    partition: str
    key: str
    values: dict[str, Any]
    put: bool = False

    def params(self, table: str) -> dict[str, Any]:
        from boto3.dynamodb.types import TypeSerializer

        ser = TypeSerializer()
        key = {"run_id": {"S": self.partition}, "Site": {"S": self.key}}
        if self.put:
            item = {**key, **{k: ser.serialize(v) for k, v in self.values.items()}}
            return {"TableName": table, "Item": item}
        names = {f"#a{n}": k for n, k in enumerate(self.values)}
        return {
            "TableName": table,
            "Key": key,
            "UpdateExpression": "SET " + ", ".join(f"#a{n} = :a{n}" for n in range(len(self.values))),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": {f":a{n}": ser.serialize(v) for n, v in enumerate(self.values.values())},
        }


@dataclass
class Tally:
    """What became of the writes: sent (and taken), refused by IAM (the policy's evaluator), refused by DynamoDB."""

    sent: int = 0
    refused_by_iam: int = 0
    refused_by_dynamodb: int = 0
    kinds: set[str] = field(default_factory=set)  # the DynamoDB types of the values sent
    why: dict[str, int] = field(default_factory=dict)  # DynamoDB's reasons for what it refused
    keys: set[tuple[str, str]] = field(default_factory=set)


def writes(run_id: str, honest: list[str], node_attrs: list[str], nodes: list[str]) -> st.SearchStrategy[Write]:
    """A hostile write for run `run_id`: random values into the node role's attributes (and names outside them),
    on junk items of the run's partition (site ids no config has, node items of nodes that are not, keys of the
    hub's own items), the honest sites' attributes that are not their decisions, the honest nodes' items, the
    run's pacing partition, rate-limit groups, high-water marks, and the hub's partitions (which IAM refuses)."""
    junk_site = st.builds(
        lambda head, tail: head + tail,
        st.sampled_from(string.ascii_lowercase),
        st.text(string.ascii_lowercase + string.digits + "._-", max_size=12),
    ).filter(lambda s: s not in honest)
    anything = st.text(min_size=1, max_size=60)
    named = [a for a in node_attrs if a not in ("run_id", "Site")]  # keys: an UpdateItem may name, never set, them
    attrs = st.sampled_from([*named, *HUB_ONLY])
    honest_attrs = st.sampled_from([a for a in node_attrs if a not in DECISIONS and a not in ("run_id", "Site")])

    def update(partition: st.SearchStrategy[str], key: st.SearchStrategy[str], names: st.SearchStrategy[str]):
        return st.builds(Write, partition, key, st.dictionaries(names, VALUES, min_size=1, max_size=3))

    run = st.just(run_id)
    honest_write = st.builds(
        Write, run, st.sampled_from(honest), st.dictionaries(honest_attrs, VALUES, min_size=1, max_size=3)
    ).filter(lambda w: not forged_history(w.values))
    return st.one_of(
        update(run, junk_site, attrs),
        honest_write,
        update(run, st.sampled_from([*(f"#node#{n}" for n in nodes), "#node#i-0evil"]), attrs),
        update(run, st.builds(lambda s: "#node#" + s, anything) | st.sampled_from(["#run", "#h#1#1", "#x"]), attrs),
        update(st.just(f"#pacing:{run_id}"), anything, attrs),
        update(st.just("#limits"), anything.map(lambda s: "g-" + s), attrs),
        update(st.sampled_from([f"#run:{run_id}", "#runs"]), st.sampled_from(["#run", run_id, "#h#9#9"]), attrs),
        st.builds(
            Write,
            st.just("#sites"),
            junk_site,
            st.fixed_dictionaries({"mark": VALUES, "run": VALUES, "at": VALUES}),
            st.just(True),
        ),
    )


def forged_history(values: dict[str, Any]) -> bool:
    """Values a reader can take for an attempt history (a list for `attempts`, a count for `spot_requeues`): a
    history forged readably, which `gridfleet check` is there to catch (it does: a violation), not a value no one
    can read. The fuzz writes the honest sites only the latter."""
    from fleet.record.readback import as_count

    return isinstance(values.get("attempts"), list) or as_count(values.get("spot_requeues", "x")) is not None


def node_policy(terraform_dir: Path) -> tuple[list[Statement], str, list[str]]:
    """The node role's inline policy as the twin's apply of infra/terraform renders it (on a moto server of its
    own, stopped after), the table's ARN in it, and the attributes its UpdateItem statement allows."""
    from moto.server import ThreadedMotoServer

    from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
    from fleet.config.aws import AwsConfig
    from tests.helpers.stacks import stack_names
    from twin.terraform.apply import apply_stack

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        clients = AwsClients(AwsConfig(endpoint_url=endpoint, region="ap-northeast-2"), credentials=LOCAL_CREDENTIALS)
        ami = clients.client("ec2").describe_images()["Images"][0]["ImageId"]
        out = apply_stack(clients, terraform_dir, stack_names("gfh"), hub_user_data="#cloud-config\n", ami_id=ami)
        doc = json.loads(out.policies["aws_iam_role_policy.node.policy"])
        arn = clients.client("dynamodb").describe_table(TableName=out.table)["Table"]["TableArn"]
    finally:
        server.stop()
    (update,) = [s for s in doc["Statement"] if s.get("Sid") == "AttemptAndNodeWrites"]
    allowed = list(update["Condition"]["ForAllValues:StringEquals"]["dynamodb:Attributes"])
    return from_document(doc), arn, allowed


def allowed(statements: list[Statement], table_arn: str, w: Write) -> bool:
    action = "dynamodb:PutItem" if w.put else "dynamodb:UpdateItem"
    return decide(statements, Request(action, table_arn, dynamodb_context(w.params("t")))) == ALLOW


def kind(v: Any) -> str:
    """The DynamoDB type boto3 writes `v` as."""
    from boto3.dynamodb.types import TypeSerializer

    return next(iter(TypeSerializer().serialize(v)))


def to_memory(table: Any, w: Write) -> None:
    """`w` applied to a `sim.memory.MemoryStateTable` as DynamoDB applies it: the item made if absent (or, a PutItem,
    replaced), its index entry and node key kept as the table's own writes keep them. A value DynamoDB would refuse
    for the index's key (`openSite` must be a string) is refused here too (ValueError)."""
    from fleet.record.codec import OPEN_ATTR
    from fleet.record.partition import NODE_PREFIX

    if OPEN_ATTR in w.values and not isinstance(w.values[OPEN_ATTR], str):
        raise ValueError("the index key openSite must be a string")
    with table._lock:
        item = {"run_id": w.partition, "Site": w.key} if w.put else table.items.get((w.partition, w.key))
        if item is None:
            item = {"run_id": w.partition, "Site": w.key}
        item.update(w.values)
        table.items[(w.partition, w.key)] = item
        if w.key.startswith(NODE_PREFIX):
            table._nodes.setdefault(w.partition, set()).add(w.key)
            table._node_keys.pop(w.partition, None)
            table._node_info.pop((w.partition, w.key), None)
        elif not w.key.startswith("#"):
            table._index(w.partition, w.key, item)
