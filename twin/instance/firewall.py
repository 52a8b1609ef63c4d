"""Security groups on the twin: each instance's groups, as the twin's EC2 holds them, enforced inside its network
namespace with nftables.

EC2 filters at an instance's network interface: a packet in must match an ingress rule of one of its groups, a
packet out an egress rule, and the replies of a connection either direction allowed pass the other (security
groups are stateful). The twin's instances share one bridge with nothing between them, so each instance's
namespace gets one table (`TABLE`): its input chain holds its groups' ingress rules, its output chain their
egress rules, conntrack (per namespace) lets replies pass, and each chain ends in a counted drop, so that a
connection refused by the rules can be told from one that found no server. A rule names a CIDR or another group;
the latter matches the addresses of that group's members, the instances the twin runs that were launched in it,
so every instance's table is rebuilt whenever an instance starts or ends (`Firewalls.joined`, `left`).

What EC2 does not filter stays open: the instance's loopback, where the twin serves its metadata service
(169.254.169.254, `network.METADATA_ADDRESS`) and where an instance's packets to its own address go; IPv6's
control on the link; and the twin's AWS (see `Firewalls`). (EC2 leaves its DNS resolver and time service
unfiltered too; the twin serves neither.) `ruleset` is pure: the text `nft -f` loads, from the groups and their
members.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
import subprocess
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from twin.instance.cloud_config import TwinError
from twin.instance.network import METADATA_ADDRESS

#: The instance's nftables table (family inet: IPv4 and IPv6 alike; what no rule allows is dropped).
TABLE = "twin_security_groups"
#: The named counters of what each chain dropped: no rule of the instance's groups allowed it.
DROPPED = {"ingress": "ingress_dropped", "egress": "egress_dropped"}
#: EC2's protocol names and the numbers that mean them (`IpProtocol` is either).
_NAMES = {"6": "tcp", "17": "udp", "1": "icmp", "58": "icmpv6"}
#: IPv6's own control on the link (neighbour and router discovery, multicast listeners), which a link-local address
#: sends as it comes up: EC2's network answers or ignores it, and no group filters it.
_LINK_CONTROL = (
    "nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect, "
    "mld-listener-query, mld-listener-report, mld-listener-done, mld2-listener-report"
)
_COMMENT_MAX = 120  # nftables keeps 128 bytes of a comment
_NFT_TIMEOUT_S = 20

Endpoint = tuple[str, int]  # (address, TCP port)

log = logging.getLogger("gridfleet.twin")


def _text(value: object) -> str:
    """A description as a comment can hold it: printable ASCII without quotes, cut to what nftables keeps."""
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "?" for c in str(value))
    return plain[:_COMMENT_MAX]


def _port(value: object, where: str) -> int | None:
    """A FromPort/ToPort: None for all (EC2 says -1 or leaves it out)."""
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise TwinError(f"{where}: port {value!r} is not -1 or 0-65535")
    return value


def _protocol(perm: Mapping[str, Any], where: str) -> str:
    """The permission's match of protocol and ports ("" for every protocol)."""
    raw = str(perm.get("IpProtocol", "-1")).lower()
    name = _NAMES.get(raw, raw)
    low, high = _port(perm.get("FromPort"), where), _port(perm.get("ToPort"), where)
    if name == "-1":
        return ""
    if name in ("tcp", "udp"):
        if low is None or (low, high) == (0, 65535):
            return f"meta l4proto {name}"
        return f"{name} dport {low}" if high in (None, low) else f"{name} dport {low}-{high}"
    if name in ("icmp", "icmpv6"):  # EC2's FromPort is the ICMP type, its ToPort the code
        if low is None:
            return f"meta l4proto {name}"
        return f"{name} type {low}" + (f" {name} code {high}" if high is not None else "")
    if raw.isdigit() and 0 <= int(raw) <= 255:
        return f"meta l4proto {int(raw)}"
    raise TwinError(f"{where}: protocol {raw!r} is not one EC2 knows")


def _match(direction: str, peers: Sequence[str]) -> str:
    """`ip saddr PEERS` (ingress) or `ip daddr PEERS` (egress); `ip6` for IPv6 peers (one family per call)."""
    family = "ip6" if ipaddress.ip_network(peers[0], strict=False).version == 6 else "ip"
    side = "saddr" if direction == "ingress" else "daddr"
    return f"{family} {side} {peers[0]}" if len(peers) == 1 else f"{family} {side} {{ {', '.join(peers)} }}"


def _peers(
    perm: Mapping[str, Any], members: Mapping[str, Collection[str]], where: str
) -> Iterator[tuple[list[str], str]]:
    """(addresses or networks of one family, comment) for each peer of the permission: one rule each, as EC2
    holds one rule per peer. A group with no live member matches nothing: no rule."""
    if perm.get("PrefixListIds"):
        raise TwinError(f"{where}: prefix lists: the twin does not support them")
    for r in perm.get("IpRanges") or []:
        yield [str(ipaddress.IPv4Network(r["CidrIp"], strict=False))], _text(r.get("Description") or r["CidrIp"])
    for r in perm.get("Ipv6Ranges") or []:
        yield [str(ipaddress.IPv6Network(r["CidrIpv6"], strict=False))], _text(r.get("Description") or r["CidrIpv6"])
    for pair in perm.get("UserIdGroupPairs") or []:
        addresses = sorted(
            {ipaddress.ip_address(a) for a in members.get(pair["GroupId"], ())}, key=lambda a: (a.version, int(a))
        )
        what = pair.get("Description") or "the group's members"
        comment = _text(f"{pair['GroupId']}: {what}")
        for version in (4, 6):
            same = [str(a) for a in addresses if a.version == version]
            if same:
                yield same, comment


def _rules(groups: Sequence[Mapping[str, Any]], members: Mapping[str, Collection[str]], direction: str) -> list[str]:
    key = "IpPermissions" if direction == "ingress" else "IpPermissionsEgress"
    lines = []
    for group in groups:
        for n, perm in enumerate(group.get(key) or []):
            where = f"security group {group.get('GroupId')} {direction} rule {n + 1}"
            l4 = _protocol(perm, where)
            for peers, comment in _peers(perm, members, where):
                match = " ".join(p for p in (_match(direction, peers), l4) if p)
                lines.append(f'{match} accept comment "{comment}"')
    return lines


def _chain(direction: str, rules: list[str], exempt: Sequence[Endpoint]) -> list[str]:
    hook, side = ("input", "iif") if direction == "ingress" else ("output", "oif")
    body = [
        f"type filter hook {hook} priority filter; policy drop;",
        f'{side} "lo" accept comment "loopback: the metadata service ({METADATA_ADDRESS}), the instance to itself"',
        'ct state established,related accept comment "stateful: the replies of an allowed connection"',
        f'icmpv6 type {{ {_LINK_CONTROL} }} accept comment "IPv6 on the link: no group filters it"',
    ]
    if direction == "egress":
        body.append(f'ip daddr {METADATA_ADDRESS} accept comment "the metadata service: EC2 filters it by no group"')
        for address, port in exempt:
            match = _match("egress", [str(ipaddress.ip_address(address))])
            body.append(f'{match} tcp dport {int(port)} accept comment "the twin\'s AWS: on EC2, the APIs on 443"')
    body += rules
    body.append(f'counter name "{DROPPED[direction]}" comment "no rule of its security groups allows it"')
    return [f"\tchain {direction} {{", *(f"\t\t{line}" for line in body), "\t}"]


def ruleset(
    groups: Sequence[Mapping[str, Any]],
    members: Mapping[str, Collection[str]],
    exempt: Sequence[Endpoint] = (),
    *,
    instance: str = "",
) -> str:
    """The nftables ruleset of an instance in `groups` (DescribeSecurityGroups' entries: `IpPermissions`,
    `IpPermissionsEgress`), a group's members' addresses in `members` (group id -> addresses), `exempt` the
    endpoints it reaches whatever its groups say. It replaces the instance's table whole, in one transaction
    (the empty table first, so that deleting it never fails). TwinError names a rule the twin cannot apply."""
    names = ", ".join(_text(f"{g.get('GroupId')} ({g.get('GroupName', '')})") for g in groups) or "none"
    lines = [f"# {_text(instance or 'an instance')} in security groups {names}"]
    lines += [f"table inet {TABLE}", f"delete table inet {TABLE}", f"table inet {TABLE} {{"]
    lines += [f"\tcounter {name} {{\n\t}}" for name in DROPPED.values()]
    for direction in DROPPED:
        lines += _chain(direction, _rules(groups, members, direction), exempt)
    return "\n".join([*lines, "}"]) + "\n"


def nft(netns: str, *args: str, script: str | None = None) -> str:
    """`nft ARGS` inside the namespace (`-f -` with `script`), its output; TwinError with nft's own message."""
    if shutil.which("nft") is None:
        raise TwinError("nft is missing (`make setup` installs nftables): the twin cannot enforce security groups")
    cmd = ["ip", "netns", "exec", netns, "nft", *args]
    out = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=_NFT_TIMEOUT_S)
    if out.returncode != 0:
        raise TwinError(f"nft {' '.join(args)} in {netns}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def load_ruleset(netns: str, text: str) -> None:
    """The ruleset (`ruleset`'s) in force in the namespace, in one transaction."""
    nft(netns, "-f", "-", script=text)


def dropped(netns: str) -> dict[str, int]:
    """Packets each chain of the instance's table dropped so far: {"ingress": n, "egress": m}."""
    out = json.loads(nft(netns, "-j", "list", "counters", "table", "inet", TABLE))
    counts = {o["counter"]["name"]: int(o["counter"]["packets"]) for o in out["nftables"] if "counter" in o}
    return {direction: counts.get(name, 0) for direction, name in DROPPED.items()}


@dataclass
class _Member:
    netns: str
    address: str
    groups: tuple[str, ...]
    loaded: str | None = None  # the ruleset its namespace holds


class Firewalls:
    """The security groups of the instances the twin runs, enforced in their namespaces.

    `joined` (an instance's namespace is on the bridge and nothing runs in it yet) loads its table, then rebuilds
    the others', whose group rules may name one of its groups; `left` (its namespace is gone) rebuilds the others'
    without it. The groups' rules are read from the twin's EC2 at each rebuild, as they are then.

    `exempt` is the twin's AWS (moto's server on the bridge's host address, at its port). On AWS the instances
    reach the APIs through the NAT instance or VPC endpoints on 443, which the stack's egress rules allow
    (`hub_web`, `node_web`); the twin's stand-in listens on the host at a port of its own, which no rule of the
    stack names, so that one address and port is let out as the stack lets 443 out, and nothing else of the host.
    """

    def __init__(
        self, ec2: Any, exempt: Sequence[Endpoint] = (), load: Callable[[str, str], None] | None = None
    ) -> None:
        self.ec2 = ec2
        self.exempt = tuple(exempt)
        self.load = load or load_ruleset  # (netns, ruleset)
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()

    def joined(self, instance_id: str, netns: str, address: str, groups: Sequence[str]) -> None:
        with self._lock:
            self._members[instance_id] = _Member(netns, address, tuple(groups))
            self._rebuild(first=instance_id)

    def left(self, instance_id: str) -> None:
        """Never raises: the instance is gone whatever the others' rules say. A rebuild that fails is logged, and
        the next (at the next instance's start, before anything runs in it) makes every table right again."""
        with self._lock:
            if self._members.pop(instance_id, None) is None:
                return
            try:
                self._rebuild()
            except (TwinError, ClientError, BotoCoreError) as e:
                log.warning("twin-firewall-rebuild-failed left=%s error=%s", instance_id, e)

    def ruleset_of(self, instance_id: str) -> str | None:
        """The ruleset the instance's namespace holds, or None."""
        member = self._members.get(instance_id)
        return member.loaded if member else None

    def _rebuild(self, first: str | None = None) -> None:
        wanted = sorted({g for m in self._members.values() for g in m.groups})
        # by filter, so that a group EC2 no longer has (moto's state reset under running instances) is left out
        # rather than failing the call: an instance in no group EC2 knows is let nothing in or out
        filters = [{"Name": "group-id", "Values": wanted}]
        found = self.ec2.describe_security_groups(Filters=filters)["SecurityGroups"] if wanted else []
        groups = {g["GroupId"]: g for g in found}
        members: dict[str, list[str]] = {}
        for m in self._members.values():
            for g in m.groups:
                members.setdefault(g, []).append(m.address)
        order = sorted(self._members, key=lambda iid: iid != first)  # the new instance's own table first
        for iid in order:
            m = self._members[iid]
            text = ruleset([groups[g] for g in m.groups if g in groups], members, self.exempt, instance=iid)
            if text != m.loaded:
                self.load(m.netns, text)
                m.loaded = text
