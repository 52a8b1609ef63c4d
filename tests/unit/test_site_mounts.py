"""The site-mount helper (node/site_mounts.py) answering the agent's client (profiles/mounts.py) over a real unix
socket: who may ask (the kernel's peer credentials), that a mount needs this node's claim of the site and the
site's own access point, and what mount(8) and umount(8) are asked. Fakes at the seams: the state table and EFS
(a record and a listing), and the mount commands (recorded, their effect kept in a set); the twin runs the real
ones (tests/twin/test_site_profiles.py)."""

from __future__ import annotations

import os
import subprocess
import threading
from types import SimpleNamespace

import pytest

from fleet.record.state import RunStatus
from node.site_mounts import SiteMounter, listen, serve
from profiles import SiteMountFailed, SocketMounts

FS = "fs-0123456789abcdef0"
NODE = "i-0123456789abcdef0"
POINT = {
    "AccessPointId": "fsap-00000000000000aaa",
    "FileSystemId": FS,
    "PosixUser": {"Uid": 2000, "Gid": 2000},
    "RootDirectory": {"Path": "/gridfleet/sites/a"},
    "Tags": [{"Key": "gridfleet:stack", "Value": "gf"}, {"Key": "gridfleet:site", "Value": "a"}],
}


class Table:
    def __init__(self, records):
        self.records = records

    def get_site(self, run_id, site):
        return self.records.get(site)


class Efs:
    def __init__(self, points):
        self.points, self.calls = points, 0

    def describe_access_points(self, **kw):
        assert kw == {"FileSystemId": FS}
        self.calls += 1
        return {"AccessPoints": self.points}


class Mounts:
    """mount(8) and umount(8) as the helper runs them: recorded; `busy` makes a plain umount fail."""

    def __init__(self):
        self.now: set[str] = set()
        self.argv: list[list[str]] = []
        self.busy = False
        self.unreachable = False  # every mount times out (a mount target that never answers)

    def run(self, argv, **kw):
        self.argv.append(argv)
        if argv[0] == "mount" and self.unreachable:
            return subprocess.CompletedProcess(argv, 32, "", "mount.nfs4: Connection timed out")
        if argv[0] == "mount":
            self.now.add(argv[-1])
        elif argv[0] == "umount" and (argv[1] == "--lazy" or not self.busy):
            self.now.discard(argv[-1])
        else:
            return subprocess.CompletedProcess(argv, 32, "", "umount: target is busy")
        return subprocess.CompletedProcess(argv, 0, "", "")


def held_by(node):
    return SimpleNamespace(run_status=RunStatus.RUN, instance_id=node)


@pytest.fixture
def helper(tmp_path):
    """The helper on a socket of its own (in a thread, for the test's life), and what it works with."""

    def start(records, points=(POINT,), allowed=None):
        root = tmp_path / "efs"
        root.mkdir(exist_ok=True)
        mounts, efs = Mounts(), Efs(list(points))
        mounter = SiteMounter(table=Table(records), efs=efs, efs_id=FS, stack="gf", uid=2000, run_id="r",
                              instance_id=NODE, root=root, run=mounts.run,
                              is_mounted=lambda p: str(p) in mounts.now, sleep=lambda s: None)  # fmt: skip
        sock = tmp_path / "mounts.sock"
        uids = frozenset({os.geteuid()}) if allowed is None else allowed
        srv = listen(sock)  # listening before the thread answers: the client's first ask never finds it missing
        threading.Thread(target=serve, args=(srv, mounter, uids), daemon=True).start()
        client = SocketMounts(sock, timeout_s=10)
        return SimpleNamespace(client=client, mounts=mounts, efs=efs, root=root)

    return start


def test_a_site_this_node_holds_is_mounted_through_its_access_point_and_unmounted(helper):
    h = helper({"a": held_by(NODE)})
    assert h.client.ask("ping") == {"ok": True, "asked_s": pytest.approx(0, abs=10)}
    h.client.mount("a")
    target = str(h.root / "a")
    assert h.mounts.argv == [["mount", "-t", "efs", "-o", "tls,iam,accesspoint=fsap-00000000000000aaa", f"{FS}:/",
                              target]]  # fmt: skip
    h.client.mount("a")  # asked again: it is there already, nothing is run
    assert len(h.mounts.argv) == 1 and h.efs.calls == 1  # and the access point was looked up once
    assert h.client.unmount("a") is True
    assert h.mounts.argv[-1] == ["umount", target] and not (h.root / "a").exists()


def test_a_busy_mount_is_detached_lazily(helper):
    h = helper({"a": held_by(NODE)})
    h.client.mount("a")
    h.mounts.busy = True
    assert h.client.unmount("a") is True
    assert [a[:2] for a in h.mounts.argv[1:]] == [["umount", str(h.root / "a")], ["umount", "--lazy"]]
    assert h.mounts.now == set()


@pytest.mark.parametrize(
    ("records", "why"),
    [
        ({}, "site 'a' of run r is not claimed by i-0123456789abcdef0 (no record)"),
        ({"a": held_by("i-0fedcba9876543210")}, "(RUN on i-0fedcba9876543210)"),
        ({"a": SimpleNamespace(run_status=RunStatus.COMPLETED, instance_id=NODE)}, "(COMPLETED on i-0123456789abcd"),
    ],
)
def test_a_site_this_node_does_not_hold_is_refused(helper, records, why):
    h = helper(records)
    with pytest.raises(SiteMountFailed, match=r"^mount a: .*" + why.replace("(", r"\(").replace(")", r"\)")):
        h.client.mount("a")
    assert h.mounts.argv == [] and not (h.root / "a").exists()


def test_a_site_without_its_own_access_point_is_refused(helper):
    wrong_root = {**POINT, "RootDirectory": {"Path": "/gridfleet"}}  # tagged a's, but rooted above every site
    h = helper({"a": held_by(NODE)}, points=[wrong_root])
    with pytest.raises(SiteMountFailed, match="site 'a' has no access point of stack gf on fs-0123456789abcdef0"):
        h.client.mount("a")
    assert h.mounts.argv == []


def test_only_the_crawl_user_and_root_may_ask(helper):
    h = helper({"a": held_by(NODE)}, allowed=frozenset({os.geteuid() + 1}))
    with pytest.raises(SiteMountFailed, match=f"uid {os.geteuid()} may not ask for mounts"):
        h.client.mount("a")
    assert h.mounts.argv == []


def test_a_request_that_is_no_request_is_answered_and_the_helper_goes_on(helper):
    h = helper({"a": held_by(NODE)})
    for bad in ("mount", "unmount"):
        with pytest.raises(SiteMountFailed, match="a request is"):
            h.client.ask(bad, "../etc")
    assert h.client.ask("ping")["ok"] is True


def test_an_unmount_never_raises_in_the_closing_crawl(tmp_path):
    assert SocketMounts(tmp_path / "no-such.sock").unmount("a") is False
    with pytest.raises(SiteMountFailed, match="did not answer"):
        SocketMounts(tmp_path / "no-such.sock").mount("a")


def test_the_mount_point_root_holds_only_what_is_mounted(helper):
    h = helper({"a": held_by(NODE)})
    h.client.mount("a")
    assert sorted(p.name for p in h.root.iterdir()) == ["a"]
    h.client.unmount("a")
    assert list(h.root.iterdir()) == []


def test_a_mount_that_keeps_failing_is_refused_and_leaves_no_mount_point(helper):
    h = helper({"a": held_by(NODE)})
    h.mounts.unreachable = True
    with pytest.raises(SiteMountFailed, match="mount.nfs4: Connection timed out"):
        h.client.mount("a")
    assert len(h.mounts.argv) == 3 and not (h.root / "a").exists()


def test_the_helper_must_be_root(monkeypatch, tmp_path, capsys):
    from node.site_mounts import serve_main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    argv = ["--config", str(tmp_path / "f.yaml"), "--run-id", "r", "--socket", str(tmp_path / "s")]
    assert serve_main(argv) == 2
    assert capsys.readouterr().err.strip() == "gridfleet node site-mounts: must run as root (it mounts)"


def test_paths_read_from_mountinfo_are_unescaped():
    from node.site_mounts import _unescape

    assert _unescape("/efs/a\\040b\\134c") == "/efs/a b\\c"
