"""The twin's security groups as nftables rulesets (`twin.instance.firewall.ruleset`, pure), the rebuilds as instances
come and go (`Firewalls`, its loader and EC2 given: the seam is the `nft` call and DescribeSecurityGroups), and which
groups an instance was launched in (`twin.ec2twin`). The groups are written as EC2's DescribeSecurityGroups gives
them; tests/twin/test_security_groups.py loads the stack's own into real namespaces."""

from __future__ import annotations

import pytest

from twin.ec2twin import _groups
from twin.instance.cloud_config import TwinError
from twin.instance.firewall import TABLE, Firewalls, ruleset

HUB, NODE, EFS = "sg-0hub", "sg-0node", "sg-0efs"


def by_group(group: str, protocol: str, low: int | None, high: int | None, description: str) -> dict:
    perm: dict = {"IpProtocol": protocol, "UserIdGroupPairs": [{"GroupId": group, "Description": description}]}
    return perm | ({"FromPort": low, "ToPort": high} if low is not None else {})


def by_cidr(cidr: str, protocol: str, low: int | None, high: int | None, description: str = "") -> dict:
    key, member = ("Ipv6Ranges", "CidrIpv6") if ":" in cidr else ("IpRanges", "CidrIp")
    peer = {member: cidr, **({"Description": description} if description else {})}
    perm: dict = {"IpProtocol": protocol, key: [peer]}
    return perm | ({"FromPort": low, "ToPort": high} if low is not None else {})


#: The stack's node group as the twin's EC2 holds it once infra/terraform is applied (security_groups.tf).
NODE_GROUP = {
    "GroupId": NODE,
    "GroupName": "gft-node",
    "IpPermissions": [
        by_group(HUB, "tcp", 5555, 5555, "Selenium Grid node port from the hub"),
        by_group(HUB, "tcp", 22, 22, "SSH from the hub only (kill path)"),
    ],
    "IpPermissionsEgress": [
        by_group(HUB, "tcp", 4444, 4444, "Selenium Grid grid port on the hub"),
        by_group(EFS, "tcp", 2049, 2049, "NFS to the EFS mount targets"),
        by_cidr("0.0.0.0/0", "tcp", 443, 443, "The crawled sites, AWS APIs and package mirrors"),
    ],
}


def chain(text: str, name: str) -> list[str]:
    """The lines of one chain of a ruleset, without its indentation."""
    lines = text.splitlines()
    start = lines.index(f"\tchain {name} {{")
    return [line.strip() for line in lines[start + 1 : lines.index("\t}", start)]]


#: How many lines open each chain whatever the groups say: its hook, loopback, replies, IPv6 on the link (and, out,
#: the metadata service).
OPENING = {"ingress": 4, "egress": 5}


def rules(text: str, name: str, exempt: int = 0) -> list[str]:
    """The chain's lines after its opening (and `exempt` lines of endpoints let out)."""
    return chain(text, name)[OPENING[name] + exempt :]


def test_a_nodes_ruleset_is_its_groups_rules_over_their_members_and_a_counted_drop():
    text = ruleset([NODE_GROUP], {HUB: ["10.77.0.2"], NODE: ["10.77.0.3", "10.77.0.4"]}, [("10.77.0.1", 40123)])
    assert rules(text, "ingress") == [
        'ip saddr 10.77.0.2 tcp dport 5555 accept comment "sg-0hub: Selenium Grid node port from the hub"',
        'ip saddr 10.77.0.2 tcp dport 22 accept comment "sg-0hub: SSH from the hub only (kill path)"',
        'counter name "ingress_dropped" comment "no rule of its security groups allows it"',
    ]
    assert rules(text, "egress", exempt=1) == [
        'ip daddr 10.77.0.2 tcp dport 4444 accept comment "sg-0hub: Selenium Grid grid port on the hub"',
        # no rule for the EFS group: it has no member the twin runs
        'ip daddr 0.0.0.0/0 tcp dport 443 accept comment "The crawled sites, AWS APIs and package mirrors"',
        'counter name "egress_dropped" comment "no rule of its security groups allows it"',
    ]
    assert "policy drop;" in chain(text, "ingress")[0] and "policy drop;" in chain(text, "egress")[0]


def test_what_ec2_filters_by_no_group_comes_first_and_the_twins_aws_is_let_out_alone():
    text = ruleset([NODE_GROUP], {}, [("10.77.0.1", 40123)])
    ingress, egress = chain(text, "ingress"), chain(text, "egress")
    assert ingress[1].startswith('iif "lo" accept') and egress[1].startswith('oif "lo" accept')
    assert ingress[2].startswith("ct state established,related accept")
    assert egress[2].startswith("ct state established,related accept")
    assert ingress[3].startswith("icmpv6 type { ") and "nd-neighbor-solicit" in ingress[3]
    assert egress[4].startswith("ip daddr 169.254.169.254 accept")
    assert egress[5].startswith("ip daddr 10.77.0.1 tcp dport 40123 accept")
    assert "40123" not in "\n".join(ingress)


def test_the_ruleset_replaces_the_instances_table_whole():
    lines = ruleset([], {}, instance="i-0123456789abcdef0").splitlines()
    assert lines[:4] == ["# i-0123456789abcdef0 in security groups none", f"table inet {TABLE}",
                         f"delete table inet {TABLE}", f"table inet {TABLE} {{"]  # fmt: skip
    assert lines[-1] == "}"
    assert ruleset([], {}) == ruleset([], {})


def test_a_group_reference_matches_its_members_of_each_family_once_in_order():
    group = {"GroupId": NODE, "IpPermissions": [by_group(NODE, "-1", None, None, "")], "IpPermissionsEgress": []}
    members = {NODE: ["10.77.0.12", "fd00::2", "10.77.0.3", "10.77.0.12"]}
    assert rules(ruleset([group], members), "ingress")[:2] == [
        'ip saddr { 10.77.0.3, 10.77.0.12 } accept comment "sg-0node: the group\'s members"',
        'ip6 saddr fd00::2 accept comment "sg-0node: the group\'s members"',
    ]


@pytest.mark.parametrize(
    ("protocol", "low", "high", "match"),
    [
        ("-1", None, None, "ip daddr 10.0.0.0/8 accept"),
        ("tcp", -1, -1, "ip daddr 10.0.0.0/8 meta l4proto tcp accept"),
        ("tcp", 0, 65535, "ip daddr 10.0.0.0/8 meta l4proto tcp accept"),
        ("6", 4442, 4444, "ip daddr 10.0.0.0/8 tcp dport 4442-4444 accept"),
        ("udp", 53, 53, "ip daddr 10.0.0.0/8 udp dport 53 accept"),
        ("icmp", 8, -1, "ip daddr 10.0.0.0/8 icmp type 8 accept"),
        ("1", 3, 4, "ip daddr 10.0.0.0/8 icmp type 3 icmp code 4 accept"),
        ("icmp", -1, -1, "ip daddr 10.0.0.0/8 meta l4proto icmp accept"),
        ("50", None, None, "ip daddr 10.0.0.0/8 meta l4proto 50 accept"),
    ],
)
def test_protocols_and_ports_as_ec2_says_them(protocol, low, high, match):
    group = {"GroupId": NODE, "IpPermissionsEgress": [by_cidr("10.1.2.3/8", protocol, low, high, "x")]}
    assert rules(ruleset([group], {}), "egress")[0] == f'{match} comment "x"'


def test_ipv6_ranges_and_a_cidr_without_a_description():
    group = {
        "GroupId": NODE,
        "IpPermissions": [by_cidr("fd00::/8", "tcp", 22, 22), by_cidr("10.0.0.0/16", "tcp", 22, 22)],
    }
    assert rules(ruleset([group], {}), "ingress")[:2] == [
        'ip6 saddr fd00::/8 tcp dport 22 accept comment "fd00::/8"',
        'ip saddr 10.0.0.0/16 tcp dport 22 accept comment "10.0.0.0/16"',
    ]


def test_a_description_cannot_break_out_of_its_comment():
    group = {"GroupId": NODE, "IpPermissions": [by_cidr("10.0.0.0/16", "tcp", 22, 22, 'a "b" \\ c\nd é' + "x" * 300)]}
    line = rules(ruleset([group], {}), "ingress")[0]
    comment = line.split(' comment "', 1)[1]
    assert comment.startswith("a ?b? ? c?d ?x") and comment.endswith('"') and len(comment) <= 121
    assert comment[:-1].count('"') == 0


RULE_1 = "security group sg-0node ingress rule 1"


@pytest.mark.parametrize(
    ("perm", "error"),
    [
        ({"IpProtocol": "tcp", "FromPort": 1, "ToPort": 1, "PrefixListIds": [{"PrefixListId": "pl-1"}]},
         f"{RULE_1}: prefix lists: the twin does not support them"),
        (by_cidr("10.0.0.0/8", "tcp", 1, 70000), f"{RULE_1}: port 70000 is not -1 or 0-65535"),
        (by_cidr("10.0.0.0/8", "gre", None, None), f"{RULE_1}: protocol 'gre' is not one EC2 knows"),
    ],
)  # fmt: skip
def test_a_rule_the_twin_cannot_apply_is_named(perm, error):
    with pytest.raises(TwinError) as e:
        ruleset([{"GroupId": NODE, "IpPermissions": [perm]}], {})
    assert str(e.value) == error


class FakeEc2:
    """DescribeSecurityGroups of the given groups, counted (the seam `Firewalls` reads EC2 through)."""

    def __init__(self, groups: list[dict]) -> None:
        self.groups = {g["GroupId"]: g for g in groups}
        self.calls = 0

    def describe_security_groups(self, Filters: list[dict]) -> dict:  # noqa: N803 - boto3's name
        self.calls += 1
        [wanted] = [f["Values"] for f in Filters if f["Name"] == "group-id"]
        return {"SecurityGroups": [self.groups[g] for g in wanted if g in self.groups]}


HUB_GROUP = {
    "GroupId": HUB,
    "GroupName": "gft-hub",
    "IpPermissions": [by_group(NODE, "tcp", 4444, 4444, "Selenium Grid grid port from the nodes")],
    "IpPermissionsEgress": [by_group(NODE, "tcp", 5555, 5555, "Selenium Grid node port")],
}


def test_each_instances_rules_are_rebuilt_as_instances_come_and_go():
    loaded: list[tuple[str, str]] = []
    fw = Firewalls(FakeEc2([HUB_GROUP, NODE_GROUP]), [("10.77.0.1", 40123)], load=lambda ns, t: loaded.append((ns, t)))
    fw.joined("i-hub", "ns-hub", "10.77.0.2", [HUB])
    assert [ns for ns, _ in loaded] == ["ns-hub"] and "10.77.0.3" not in loaded[-1][1]
    fw.joined("i-a", "ns-a", "10.77.0.3", [NODE])
    assert [ns for ns, _ in loaded[1:]] == ["ns-a", "ns-hub"]  # its own first, before anything runs in it
    assert "ip daddr 10.77.0.3 tcp dport 5555 accept" in fw.ruleset_of("i-hub")
    fw.joined("i-b", "ns-b", "10.77.0.4", [NODE])
    assert [ns for ns, _ in loaded[3:]] == ["ns-b", "ns-hub"]  # the other node's rules name no node: unchanged
    assert "ip daddr { 10.77.0.3, 10.77.0.4 } tcp dport 5555 accept" in fw.ruleset_of("i-hub")
    fw.left("i-a")
    assert [ns for ns, _ in loaded[5:]] == ["ns-hub"] and fw.ruleset_of("i-a") is None
    assert "10.77.0.3" not in fw.ruleset_of("i-hub") and "ip daddr 10.77.0.4 tcp dport 5555" in fw.ruleset_of("i-hub")
    fw.left("i-a")  # again: nothing
    assert len(loaded) == 6


def test_a_rebuild_that_fails_as_an_instance_leaves_is_made_right_at_the_next_start():
    failing: list[bool] = []

    def load(netns: str, text: str) -> None:
        if failing:
            raise TwinError(f"nft -f - in {netns}: Error: Could not process rule")

    fw = Firewalls(FakeEc2([HUB_GROUP, NODE_GROUP]), load=load)
    fw.joined("i-hub", "ns-hub", "10.77.0.2", [HUB])
    fw.joined("i-a", "ns-a", "10.77.0.3", [NODE])
    failing.append(True)
    fw.left("i-a")  # the instance is gone all the same
    assert "10.77.0.3" in fw.ruleset_of("i-hub")  # what the hub's namespace still holds
    failing.clear()
    fw.joined("i-b", "ns-b", "10.77.0.4", [NODE])
    assert "10.77.0.3" not in fw.ruleset_of("i-hub") and fw.ruleset_of("i-hub").count("10.77.0.4") == 2


def test_a_group_ec2_no_longer_has_lets_nothing_in_or_out():
    fw = Firewalls(FakeEc2([HUB_GROUP]), load=lambda ns, t: None)
    fw.joined("i-a", "ns-a", "10.77.0.3", [NODE])
    text = fw.ruleset_of("i-a")
    assert text.startswith("# i-a in security groups none\n")
    assert rules(text, "ingress") == [
        'counter name "ingress_dropped" comment "no rule of its security groups allows it"'
    ]


def test_an_instance_is_in_the_groups_of_its_templates_interface_else_its_own():
    moto_default = {"SecurityGroups": [], "NetworkInterfaces": [{"Groups": [{"GroupId": "sg-default"}]}]}
    hub_template = {"NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": "subnet-1", "Groups": [HUB]}]}
    assert _groups(moto_default, hub_template) == (HUB,)  # moto left it in its default VPC's default group
    assert _groups({"SecurityGroups": [{"GroupId": NODE}]}, {"SecurityGroupIds": [NODE]}) == (NODE,)
    assert _groups(moto_default, {}) == ("sg-default",)  # launched without groups: its VPC's default group
    assert _groups({}, {}) == ()
