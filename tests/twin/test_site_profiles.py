"""A crawl sees its own site's profile and lock, and no other site's: on an instance of the twin, root's site-mount
helper (`gridfleet node site-mounts`, node/site_mounts.py) mounts, when the crawl user asks, the access point of the
site this instance holds a claim of, which the hub's code made on the twin's EFS (fleet/aws/efs.py) after the
instance booted, at /efs/<site>, through amazon-efs-utils' mount.efs (the twin's stand-in, twin/instance/standins.py);
it refuses a site the instance does not hold, and unmounts after the crawl.

Real parts: moto as the twin's DynamoDB and EFS, the instance's network and mount namespaces, its IMDS, the stand-in
amazon-efs-utils package installed by the boot scripts' own step, mount(8), the real ProfileStore and its fcntl lock,
the crawl user made with useradd and reached with setpriv. The seam: the instance runs the code of this working tree
with Debian's python3 and this tree's dependencies (PYTHONPATH), not a bundle (tests/twin/test_twin_day.py boots
that path whole). Root only (see conftest)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from fleet.aws.bootstrap import ensure_resources
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.aws.efs import ensure_site_points, site_root
from fleet.aws.table import DynamoStateTable
from fleet.config.load import parse_config
from fleet.record import ops
from fleet.record.partition import RunInfo
from fleet.record.state import SiteSpec
from tests.helpers.twin_stacks import running_twin
from tests.helpers.wait import wait_for
from tests.twin.test_fidelity import install_steps

REGION = "ap-northeast-2"
ROOT = Path(__file__).resolve().parents[2]
SITE_PACKAGES = next((ROOT / ".venv" / "lib").glob("python3.*/site-packages"))
RUN = "2026-11-21"
STACK = "gfsites"
OTHER_NODE = "i-0fedcba9876543210"
#: Where the crawl user's check writes what it saw (the instance's state directory).
OUT = "/var/lib/gridfleet/out.json"
GO = "/var/lib/gridfleet/go"
#: The code the crawl user's check imports (the profile store and its lock library), copied in for it.
CODE = "/var/lib/gridfleet/crawl-code"


@pytest.fixture(scope="module")
def twin(twin_ok):
    with running_twin("gridfleet-twin-sites-", REGION) as stack:
        yield stack


# What the crawl user does on the instance, with the project's own client and profile store.
CHECK = r"""
import errno, json, os, sys, time
sys.dont_write_bytecode = True
sys.path[:0] = sys.argv[1:3]
from profiles import ProfileStore, SiteMountFailed, SocketMounts

share, host_share = sys.argv[3], sys.argv[4]
mounts, store, out = SocketMounts("/var/lib/gridfleet/site-mounts.sock"), ProfileStore("/efs", per_site=True), {}

def denied(what, path):
    try:
        os.listdir(path) if os.path.isdir(path) else open(path).close()
        out[what] = "open"
    except OSError as e:
        out[what] = errno.errorcode[e.errno]

started = time.monotonic()
mounts.mount("a")
out["mount_s"] = time.monotonic() - started
held = store.acquire("a", 5)
(held.path / "Cookies").write_text("a-cookie")
out["a_entries"] = sorted(os.listdir("/efs/a"))
out["efs_entries"] = sorted(os.listdir("/efs"))
out["a_cookie"] = (held.path / "Cookies").read_text()
try:
    store.acquire("a", 0)
    out["second_acquire"] = "acquired"
except Exception as e:
    out["second_acquire"] = type(e).__name__
denied("b_mount_point", "/efs/b")
denied("share", share)
denied("b_through_share", share + "/gridfleet/sites/b/profile/Cookies")
denied("b_through_host", host_share + "/gridfleet/sites/b/profile/Cookies")
through_proc = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        open(f"/proc/{pid}/root{share}/gridfleet/sites/b/profile/Cookies").close()
        through_proc.add("open")
    except OSError as e:
        through_proc.add(errno.errorcode[e.errno])
out["b_through_proc"] = sorted(through_proc)
try:
    mounts.mount("b")
    out["b_refused"] = ""
except SiteMountFailed as e:
    out["b_refused"] = str(e)
held.release()
started = time.monotonic()
out["unmounted"] = mounts.unmount("a")
out["unmount_s"] = time.monotonic() - started
out["after"] = sorted(os.listdir("/efs"))
json.dump(out, open(sys.argv[5], "w"))
"""


def steps(share_on_host: Path) -> str:
    """The instance's runcmd: amazon-efs-utils by the boot scripts' own step, the crawl user, root's helper; once
    the test says go, the crawl user's check."""
    # this tree on Debian's python3, by sys.path (a PYTHONPATH would reach the AWS CLI that mount.efs runs)
    path = f"import sys; sys.dont_write_bytecode = True; sys.path[:0] = ['{ROOT}', '{SITE_PACKAGES}']"
    helper = f'/usr/bin/python3 -c "{path}; from node.main import main; sys.exit(main())"'
    return install_steps(
        'efs_utils_deb() { aws s3 cp --no-sign-request "s3://site-debs/amazon-efs-utils.deb" "$1"; }',
        "install_efs_utils",
        "groupadd --gid 2000 gridfleet && useradd --uid 2000 --gid 2000 --no-create-home --shell /usr/sbin/nologin "
        "gridfleet",
        "mkdir -p /efs && chmod 0755 /efs",
        "T=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token)",
        'IID=$(curl -sf -H "X-aws-ec2-metadata-token: $T" http://169.254.169.254/latest/meta-data/instance-id)',
        f"export AWS_ACCESS_KEY_ID=twin AWS_SECRET_ACCESS_KEY=twin AWS_DEFAULT_REGION={REGION}",
        f'{helper} site-mounts --config /etc/gridfleet/fleet.yaml --run-id {RUN} --instance-id "$IID" '
        "--socket /var/lib/gridfleet/site-mounts.sock >/var/log/gridfleet-mounts.log 2>&1 &",
        "helper=$!",
        f"touch {OUT} && chown 2000:2000 {OUT}",
        f"until [ -e {GO} ]; do sleep 0.2; done",
        "until [ -S /var/lib/gridfleet/site-mounts.sock ]; do sleep 0.2; done",
        # the crawl user's code where it can read it (as a node's installed bundle is): the checkout may be a
        # directory only its owner can read
        f"mkdir -p {CODE} && cp -r {ROOT}/profiles {SITE_PACKAGES}/fasteners {CODE}/ && chmod -R a+rX {CODE}",
        f"setpriv --reuid=2000 --regid=2000 --clear-groups --no-new-privs env HOME=/tmp /usr/bin/python3 "
        f"/etc/gridfleet/check.py {CODE} {CODE} /var/lib/cloud/twin/efs {share_on_host} {OUT}",
        'kill "$helper"',
    )


def test_a_node_mounted_for_its_claim_sees_that_site_alone(twin):
    endpoint = twin.endpoint
    efs = twin.client("efs")
    fs = efs.create_file_system(CreationToken="sites")["FileSystemId"]
    text = f"""
aws: {{endpoint_url: '{endpoint}', region: {REGION}, stack: {STACK}, table: t-sites, queue: q-sites,
       bucket: b-sites, efs_id: {fs}, efs_mount: /efs}}
sites: [{{id: a, start_url: 'https://a.test/'}}, {{id: b, start_url: 'https://b.test/'}}]
"""
    config = parse_config(text)
    clients = AwsClients(config.aws, credentials=LOCAL_CREDENTIALS)
    ensure_resources(clients, 30)
    table = DynamoStateTable(clients.client("dynamodb"), config.aws.table)
    table.create_run(RunInfo(RUN, "RUNNING", time.time(), time.time() + 600, "20261121"))
    for site in ("a", "b"):
        table.create_site(ops.new_site(RUN, site, SiteSpec(f"https://{site}.test/", "links"), None))
    s3 = twin.client("s3")
    s3.create_bucket(Bucket="site-debs", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.upload_file(str(twin.efs_utils_deb), "site-debs", "amazon-efs-utils.deb", ExtraArgs={"ACL": "public-read"})
    share = twin.root / "efs"
    doc = {
        "write_files": [
            {"path": "/usr/local/sbin/steps", "permissions": "0755", "content": steps(share)},
            {"path": "/etc/gridfleet/fleet.yaml", "permissions": "0644", "content": text},
            {"path": "/etc/gridfleet/check.py", "permissions": "0644", "content": CHECK},
        ],
        "runcmd": [["/usr/local/sbin/steps"]],
    }
    iid = twin.client("ec2").run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, UserData="#cloud-config\n" + json.dumps(doc)
    )["Instances"][0]["InstanceId"]
    box = wait_for(lambda: twin.running(iid), timeout=30, interval=0.1)

    # The hub's part, after the instance booted (its EFS_IDS knows no access point): each site's own access point.
    points, made = ensure_site_points(efs, fs, STACK, ["a", "b"], 2000)
    assert sorted(made) == ["a", "b"] and ensure_site_points(efs, fs, STACK, ["a", "b"], 2000) == (points, [])
    now = time.time()
    ops.claim(table, table.get_site(RUN, "a"), iid, now)  # this node holds a, another node holds b
    ops.claim(table, table.get_site(RUN, "b"), OTHER_NODE, now)
    b_dir = share / site_root("b").lstrip("/")  # b's profile as an earlier crawl of b left it, the crawl user's
    (b_dir / "profile").mkdir(parents=True)
    (b_dir / "profile" / "Cookies").write_text("b-cookie")
    for d in (share / "gridfleet", share / "gridfleet" / "sites", b_dir, b_dir / "profile"):
        shutil.chown(d, 2000, 2000)
        d.chmod(0o700)
    go = box.host_path(GO)
    assert go is not None
    go.touch()

    result = wait_for(lambda: box.wait_boot(0.1), timeout=180, interval=0.2)
    assert result.exit_code == 0, box.boot_log.read_text()[-4000:]
    out_file = box.host_path(OUT)
    assert out_file is not None
    seen = json.loads(out_file.read_text())
    helper_log = (box.host_path("/var/log/gridfleet-mounts.log") or Path("/nonexistent")).read_text()

    # a's own directory, mounted for this claim: its lock and profile, and nothing else under /efs
    assert seen["a_entries"] == [".lock", "profile"] and seen["efs_entries"] == ["a"], seen
    assert seen["a_cookie"] == "a-cookie" and seen["second_acquire"] == "ProfileBusy"
    assert (share / site_root("a").lstrip("/") / "profile" / "Cookies").read_text() == "a-cookie"  # on the "EFS"
    # b's: not mounted, and no path the crawl user can reach leads to it
    assert seen["b_mount_point"] == "ENOENT"
    assert seen["share"] == "EACCES" and seen["b_through_share"] == "EACCES"
    assert seen["b_through_host"] in ("EACCES", "ENOENT")  # the share on the host: root's (or under a /tmp hidden)
    assert "open" not in seen["b_through_proc"], seen["b_through_proc"]
    # the helper refuses b: another node holds it
    assert f"site 'b' of run {RUN} is not claimed by {iid} (RUN on {OTHER_NODE})" in seen["b_refused"]
    assert "site-mount-refused" in helper_log
    # after the crawl: unmounted, its mount point gone
    assert seen["unmounted"] is True and seen["after"] == []
    # what a claim costs on this machine, as the crawl user measured it (the helper logs its own share)
    print(f"\nsite mount per claim: mount {seen['mount_s']:.2f} s, unmount {seen['unmount_s']:.2f} s")
    print("\n".join(line for line in helper_log.splitlines() if "site-mounted" in line or "site-unmounted" in line))
