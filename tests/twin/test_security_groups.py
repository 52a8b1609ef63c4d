"""What a node that is taken over can reach: the stack's own security groups (infra/terraform applied to the twin's
EC2 by `twin.terraform.apply`) enforced on a hub and two nodes booted from the stack's launch templates.

Each instance runs small servers on the ports in question (the hub: the Grid's 4442, 4443, 4444, SSH's 22 and the
dashboard's port; a node: the Grid node's 5555, 22, and 443, a port every instance may send to). A connection the
rules refuse must fail as on EC2, dropped: the connect times out after a short wait, the filter that dropped it
counted the packet, and the same server answers the peer the rules allow (or, where no peer is allowed, the
instance itself). Nothing is faked: the groups and templates are the Terraform's, the instances boot in the twin,
the servers are sockets inside them. Root only (see conftest)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from fleet.config import HubConfig
from tests.helpers.stacks import stack_names
from tests.helpers.wait import wait_for
from twin.account import DEBIAN_PARAMETER
from twin.deploy import TERRAFORM_DIR
from twin.instance import network
from twin.instance.firewall import TABLE, dropped, nft

REGION = "ap-northeast-2"
GRID_PORTS = (4442, 4443, 4444)
DASHBOARD_PORT = HubConfig().port  # the hub's dashboard, /status and /metrics (hub/http_server.py)
HUB_PORTS = (*GRID_PORTS, 22, DASHBOARD_PORT)
NODE_PORTS = (5555, 22, 443)
#: How long a connection the rules drop is given: a connection they allow is answered in milliseconds on the
#: bridge, and one they drop is never answered, so the wait bounds the test's time, not its outcome.
DROPPED_WAIT_S = 1.5
ALLOWED_WAIT_S = 15.0
READY = "/var/lib/gridfleet/listening"

#: Listens on each port given (all addresses), answers every connection with the port's number, and marks READY
#: once every socket listens.
LISTEN = """import socket, sys, threading
def serve(s):
    while True:
        c, _ = s.accept()
        c.sendall(b"%d\\n" % s.getsockname()[1])
        c.close()
for s in [socket.create_server(("0.0.0.0", int(p))) for p in sys.argv[2:]]:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
open(sys.argv[1], "w").close()
threading.Event().wait()
"""

#: Connects to each (address, port, timeout) in turn: "open:<what the server said>", "timeout" or the error.
PROBE = """import json, socket, sys
out = []
for host, port, timeout in json.loads(sys.argv[1]):
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(30)
            out.append("open:" + s.makefile().readline().strip())
    except TimeoutError:
        out.append("timeout")
    except OSError as e:
        out.append(type(e).__name__)
print(json.dumps(out))
"""


def listening(*ports: int) -> str:
    doc = {
        "write_files": [{"path": "/usr/local/sbin/listen", "permissions": "0755", "content": LISTEN}],
        "runcmd": [
            f"setsid python3 /usr/local/sbin/listen {READY} {' '.join(map(str, ports))} >/dev/null 2>&1 &",
            f"while [ ! -e {READY} ]; do sleep 0.1; done",
        ],
    }
    return "#cloud-config\n" + json.dumps(doc)  # JSON is YAML


@pytest.fixture(scope="module")
def fleet(twin_ok):
    """The twin with the stack applied; the hub (from its template, its user-data the hub's servers) booted first,
    then two nodes (from theirs, in the stack's private subnet), so the nodes join a hub already filtered."""
    from twin.stack import TwinStack
    from twin.terraform.apply import apply_stack

    root = Path(tempfile.mkdtemp(prefix="gridfleet-twin-sg-"))
    twin = TwinStack(root, region=REGION, tick_s=0.2)
    try:
        twin.start()
        ami = twin.client("ssm").get_parameter(Name=DEBIAN_PARAMETER.format(arch="amd64"))["Parameter"]["Value"]
        names = {**stack_names("gfsg"), "region": REGION}
        stack = apply_stack(twin, TERRAFORM_DIR, names, hub_user_data=listening(*HUB_PORTS), ami_id=ami)
        twin.run()
        ec2 = twin.client("ec2")
        hub = boot(twin, ec2.run_instances(LaunchTemplate={"LaunchTemplateName": stack.hub_launch_template},
                                           MinCount=1, MaxCount=1))  # fmt: skip
        nodes = [
            boot(
                twin,
                ec2.run_instances(
                    LaunchTemplate={"LaunchTemplateName": stack.node_launch_template},
                    SubnetId=stack.private_subnet_ids[0],
                    UserData=listening(*NODE_PORTS),
                    MinCount=1,
                    MaxCount=1,
                ),
            )  # fmt: skip
            for _ in range(2)
        ]
        yield {"twin": twin, "stack": stack, "hub": hub, "a": nodes[0], "b": nodes[1]}
    finally:
        twin.stop()
        shutil.rmtree(root, ignore_errors=True)


def boot(twin, launched):
    iid = launched["Instances"][0]["InstanceId"]
    box = wait_for(lambda: twin.running(iid), timeout=60, interval=0.1)
    result = wait_for(lambda: box.wait_boot(0.1), timeout=120, interval=0.1)
    assert result.exit_code == 0, box.boot_log.read_text()[-3000:]
    return box


def probe(box, *targets: tuple[str, int, float]) -> list[str]:
    out = box.run(["python3", "-I", "-c", PROBE, json.dumps(targets)], timeout_s=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def opens(box, address: str, port: int) -> bool:
    return probe(box, (address, port, ALLOWED_WAIT_S)) == [f"open:{port}"]


def dropped_by(sender, receiver, port: int) -> str:
    """Which filter dropped the sender's connection to the receiver's port ("egress": the sender's own rules,
    "ingress": the receiver's), after the connection timed out; fails if it was not dropped, or by neither."""
    before = (dropped(sender.netns)["egress"], dropped(receiver.netns)["ingress"])
    assert probe(sender, (receiver.address, port, DROPPED_WAIT_S)) == ["timeout"]
    after = (dropped(sender.netns)["egress"], dropped(receiver.netns)["ingress"])
    grew = [name for name, b, a in zip(("egress", "ingress"), before, after, strict=True) if a > b]
    assert len(grew) == 1, (before, after)
    return grew[0]


def in_force(box) -> str:
    """The instance's table as its namespace's kernel holds it."""
    return nft(box.netns, "list", "table", "inet", TABLE)


def names(text: str, address: str) -> bool:
    return re.search(rf"(?<![.\d]){re.escape(address)}(?![.\d])", text) is not None


def test_each_instance_is_filtered_by_the_rules_of_the_stacks_own_groups(fleet):
    stack, twin, node = fleet["stack"], fleet["twin"], fleet["a"]
    assert fleet["hub"].security_groups == (stack.hub_security_group_id,)  # from the template's interface
    assert node.security_groups == fleet["b"].security_groups == (stack.node_security_group_id,)
    [group] = twin.client("ec2").describe_security_groups(GroupIds=[stack.node_security_group_id])["SecurityGroups"]
    live = {stack.hub_security_group_id, stack.node_security_group_id}  # the EFS group's members are no instances
    peers = [peer for key in ("IpPermissions", "IpPermissionsEgress") for perm in group[key]
             for peer in perm.get("UserIdGroupPairs", []) + perm.get("IpRanges", [])]  # fmt: skip
    said = {p["Description"] for p in peers if p.get("GroupId", next(iter(live))) in live}
    unmatched = {p["Description"] for p in peers} - said  # NFS to the EFS mount targets: EFS is a bind mount here
    rules = in_force(node)
    assert said and all(d in rules for d in said), rules  # every rule the twin's EC2 holds for the group
    assert unmatched == {"NFS to the EFS mount targets"} and not any(d in rules for d in unmatched)
    assert names(rules, fleet["hub"].address) and not names(rules, fleet["b"].address)  # no rule names the nodes
    print(f"\nhub {fleet['hub'].address}, nodes {node.address} and {fleet['b'].address}; the ruleset of node "
          f"{node.instance_id}:\n{twin.firewalls.ruleset_of(node.instance_id)}")  # fmt: skip


def test_a_node_reaches_the_hubs_grid_ports(fleet):
    hub, node = fleet["hub"], fleet["a"]
    assert probe(node, *((hub.address, p, ALLOWED_WAIT_S) for p in GRID_PORTS)) == [f"open:{p}" for p in GRID_PORTS]


def test_a_node_reaches_no_other_port_of_the_hub(fleet):
    hub, node = fleet["hub"], fleet["a"]
    for port in (22, DASHBOARD_PORT):
        assert dropped_by(node, hub, port) == "egress"  # the node's own rules let it out to the hub's Grid only
        assert opens(hub, hub.address, port)  # the server is there: no rule lets anyone in, the hub reaches itself


def test_a_node_reaches_no_other_node(fleet):
    hub, node, other = fleet["hub"], fleet["a"], fleet["b"]
    for port in (5555, 22):
        assert dropped_by(node, other, port) == "egress"
        assert opens(hub, other.address, port)  # the same server, from the peer the rules allow
    # 443: the node's rules let it out (the web), the other node's let nothing of a node in
    assert dropped_by(node, other, 443) == "ingress"
    assert opens(other, other.address, 443)


def test_the_hub_reaches_each_nodes_grid_and_ssh_ports(fleet):
    for node in (fleet["a"], fleet["b"]):  # both joined after the hub: its rules were rebuilt for each
        assert probe(fleet["hub"], *((node.address, p, ALLOWED_WAIT_S) for p in (5555, 22))) == ["open:5555", "open:22"]


def test_what_ec2_filters_by_no_group_stays_reachable_and_nothing_else_of_the_host(fleet):
    twin, node = fleet["twin"], fleet["a"]
    assert node.run(["aws", "sts", "get-caller-identity"], timeout_s=120).returncode == 0  # IMDS's role, the APIs
    assert twin.firewalls.exempt == ((network.HOST_ADDRESS, int(twin.endpoint.rsplit(":", 1)[1])),)
    host = socket.create_server((network.HOST_ADDRESS, 0))  # another port of the host: not the twin's AWS
    try:
        before = dropped(node.netns)["egress"]
        assert probe(node, (network.HOST_ADDRESS, host.getsockname()[1], DROPPED_WAIT_S)) == ["timeout"]
        assert dropped(node.netns)["egress"] > before
    finally:
        host.close()


def test_an_instance_that_ends_leaves_the_rules_that_named_it(fleet):
    twin, hub, gone = fleet["twin"], fleet["hub"], fleet["b"]
    assert names(in_force(hub), gone.address)
    twin.client("ec2").terminate_instances(InstanceIds=[gone.instance_id])
    wait_for(lambda: twin.running(gone.instance_id) is None, timeout=60, interval=0.1)
    rules = in_force(hub)
    assert not names(rules, gone.address) and names(rules, fleet["a"].address)
