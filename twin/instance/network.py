"""The twin's network: one bridge on the host, and per instance a network namespace joined to it by a veth.

The bridge `BRIDGE` holds `HOST_ADDRESS` (10.77.0.1/16); instance N gets 10.77.N/16 (N from 2) on its
`eth0`, and `METADATA_ADDRESS` on its own loopback, where its metadata service listens. No namespace has a
default route and nothing forwards or NATs: an instance reaches the bridge's subnet (what of it its security
groups let it, `twin.instance.firewall`), its own loopback and nothing else. Names carry fixed prefixes so that what a
crashed run left behind is found and removed (`cleanup_leftovers`). `GRIDFLEET_TWIN_NET` (0-9, default 0) picks
one of ten such networks, so twins on one machine (e.g. two test runs) never take each other's down: network N
is 10.(77+N).0.0/16 on bridge gftwin<N>.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import time
from pathlib import Path

from twin.instance.cloud_config import TwinError


def _net_number() -> int:
    text = os.environ.get("GRIDFLEET_TWIN_NET", "0").strip() or "0"
    if not (text.isdigit() and 0 <= int(text) <= 9):
        raise TwinError(f"GRIDFLEET_TWIN_NET={text!r} is not a number from 0 to 9")
    return int(text)


NET = _net_number()
BRIDGE = f"gftwin{NET}"
NETNS_PREFIX = f"gftwin{NET}-"
VETH_PREFIX = f"gft{NET}v"
SUBNET = ipaddress.IPv4Network(f"10.{77 + NET}.0.0/16")
HOST_ADDRESS = str(SUBNET.network_address + 1)
#: The bridge's own MAC, set once (locally administered). A bridge left to choose takes the lowest MAC of its
#: ports, which changes as instances come and go; every running instance's ARP entry for the host then names a
#: MAC that no port has once its veth is gone, and the instance's connections to the twin's AWS go dead until
#: the entry expires (half a minute or more). A VPC's router keeps its address.
BRIDGE_MAC = f"02:67:66:74:00:{NET:02x}"
METADATA_ADDRESS = "169.254.169.254"
#: Where the host serves what stands for the web the nodes crawl (the demo sites): a web port, since the stack's
#: security groups let the instances out to the web on 80 and 443 only (`twin.instance.firewall`).
WEB_PORT = 80
_IP_TIMEOUT_S = 20


def ip(*args: str, check: bool = True) -> str:
    """`ip ARGS`, its output; a failure raises `TwinError` with ip's own message."""
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    if check and out.returncode != 0:
        raise TwinError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def _links() -> list[str]:
    return [line.split()[0].split("@")[0] for line in ip("-br", "link").splitlines() if line.strip()]


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def ensure_bridge() -> None:
    """The bridge, with its fixed MAC and the host's address, up; idempotent."""
    if BRIDGE not in _links():
        ip("link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge")
    elif BRIDGE_MAC not in ip("-br", "link", "show", "dev", BRIDGE):
        ip("link", "set", "dev", BRIDGE, "address", BRIDGE_MAC)  # one made without it, left by a crashed run
    if f"{HOST_ADDRESS}/" not in ip("-4", "-o", "addr", "show", "dev", BRIDGE):
        ip("addr", "add", f"{HOST_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")


def address_of(index: int) -> str:
    """The address of the instance with this index (2 ... 65534)."""
    if not 2 <= index <= SUBNET.num_addresses - 2:
        raise TwinError(f"instance index {index} is outside 2-{SUBNET.num_addresses - 2}")
    return str(SUBNET.network_address + index)


def free_index() -> int:
    """The smallest index no veth of the twin uses."""
    used = {
        int(n[len(VETH_PREFIX) :]) for n in _links() if n.startswith(VETH_PREFIX) and n[len(VETH_PREFIX) :].isdigit()
    }
    return next(i for i in range(2, SUBNET.num_addresses - 1) if i not in used)


def add_instance(netns: str, index: int) -> str:
    """The instance's namespace joined to the bridge; returns its address."""
    if not netns.startswith(NETNS_PREFIX):
        raise TwinError(f"netns {netns!r} does not start with {NETNS_PREFIX}")
    address = address_of(index)
    veth = f"{VETH_PREFIX}{index}"
    ensure_bridge()
    ip("netns", "add", netns)
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    ip("link", "set", veth, "master", BRIDGE, "up")
    ip("-n", netns, "link", "set", "lo", "up")
    ip("-n", netns, "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo")
    ip("-n", netns, "addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0")
    ip("-n", netns, "link", "set", "eth0", "up")
    return address


def pids(netns: str) -> list[int]:
    """Every process in the namespace (none when it is gone)."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def describe(pid: int) -> str:
    """One line on a process: its pid, state (R running, S sleeping, D in the kernel, T stopped, Z a zombie),
    what it waits in (the kernel's wchan), its command line; what a hung instance is found out by."""
    proc = Path("/proc") / str(pid)
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = (proc / "wchan").read_text() or "-"
        argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        return f"{pid} (gone)"
    return f"{pid} {state} {wchan} {argv[:200]}"


def kill_all(netns: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process in the namespace until none is left; returns those still there at the end."""
    deadline = time.monotonic() + timeout_s
    while (left := pids(netns)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)  # the kernel takes a moment to reap what was just killed
    return pids(netns)


def remove_instance(netns: str, index: int | None) -> None:
    """The instance's processes killed, its veth and namespace deleted; idempotent."""
    kill_all(netns)
    if index is not None and f"{VETH_PREFIX}{index}" in _links():
        ip("link", "del", f"{VETH_PREFIX}{index}", check=False)
    if netns in _namespaces():
        ip("netns", "del", netns)


def cleanup_leftovers(*, bridge: bool = True) -> list[str]:
    """Remove every namespace and veth of the twin (a crashed run's), and the bridge; returns their names."""
    gone = []
    for link in _links():  # before the namespaces: deleting one takes its veth away, at some later moment
        if link.startswith(VETH_PREFIX):
            ip("link", "del", link, check=False)
            gone.append(link)
    for ns in _namespaces():
        if ns.startswith(NETNS_PREFIX):
            remove_instance(ns, None)
            gone.append(ns)
    if bridge and BRIDGE in _links():
        ip("link", "del", BRIDGE, check=False)
        gone.append(BRIDGE)
    return gone
