"""Each site's EFS access point (fleet/aws/efs.py) on the moto server: made once with its root, POSIX user and
tags, found again by the tags (moto ignores ClientToken, so nothing here relies on one), the lowest id of two,
none that is not a site's as gridfleet makes it; and EFS's 10,000 a file system, refused before anything is made
(that count is a fake listing at the client seam: moto would need 10,000 access points)."""

from __future__ import annotations

import uuid

import pytest

from fleet.aws import efs as efs_api
from fleet.errors import UsageError
from tests.adapter.conftest import moto_clients


@pytest.fixture
def efs(aws_config):
    client = moto_clients(aws_config()).client("efs")
    return client, client.create_file_system(CreationToken=uuid.uuid4().hex)["FileSystemId"]


def test_each_site_gets_its_access_point_once(efs):
    client, fs = efs
    points, made = efs_api.ensure_site_points(client, fs, "gf", ["a", "b", "a"], 2000)
    assert sorted(made) == ["a", "b"] and sorted(points) == ["a", "b"]
    again, made_again = efs_api.ensure_site_points(client, fs, "gf", ["a", "b", "c"], 2000)
    assert made_again == ["c"] and {s: again[s] for s in ("a", "b")} == points
    [raw] = client.describe_access_points(AccessPointId=points["a"])["AccessPoints"]
    assert raw["FileSystemId"] == fs and raw["PosixUser"] == {"Uid": 2000, "Gid": 2000}
    assert raw["RootDirectory"] == {
        "Path": "/gridfleet/sites/a",
        "CreationInfo": {"OwnerUid": 2000, "OwnerGid": 2000, "Permissions": "0700"},
    }
    assert {t["Key"]: t["Value"] for t in raw["Tags"]} == {"gridfleet:stack": "gf", "gridfleet:site": "a"}
    found = efs_api.find_site_point(client, fs, "gf", "b", 2000)
    assert found is not None and found.id == points["b"] and found.root == "/gridfleet/sites/b"
    assert efs_api.find_site_point(client, fs, "other-stack", "b", 2000) is None  # another stack's sites are not ours
    assert efs_api.find_site_point(client, fs, "gf", "b", 3000) is None  # nor one for another crawl uid


def test_an_access_point_that_is_not_a_sites_own_is_never_taken(efs):
    client, fs = efs
    tags = [{"Key": "gridfleet:stack", "Value": "gf"}, {"Key": "gridfleet:site", "Value": "a"}]
    client.create_access_point(FileSystemId=fs, PosixUser={"Uid": 2000, "Gid": 2000},
                               RootDirectory={"Path": "/gridfleet"}, Tags=tags)  # fmt: skip
    points, made = efs_api.ensure_site_points(client, fs, "gf", ["a"], 2000)
    assert made == ["a"]  # the one rooted above every site is counted, never used
    found, total = efs_api.site_points(client, fs, "gf", 2000)
    assert total == 2 and found["a"].id == points["a"] and found["a"].root == "/gridfleet/sites/a"


def test_of_two_access_points_of_a_site_everyone_takes_the_lowest_id():
    def point(pid):
        tags = [{"Key": "gridfleet:stack", "Value": "gf"}, {"Key": "gridfleet:site", "Value": "a"}]
        posix, root = {"Uid": 2000, "Gid": 2000}, {"Path": "/gridfleet/sites/a"}
        return {"AccessPointId": pid, "FileSystemId": "fs-0123456789abcdef0", "PosixUser": posix,
                "RootDirectory": root, "Tags": tags}  # fmt: skip

    class Efs:
        def describe_access_points(self, **kw):
            if "NextToken" not in kw:
                return {"AccessPoints": [point("fsap-0000000000000000b")], "NextToken": "2"}
            return {"AccessPoints": [point("fsap-0000000000000000a"), {**point("not-an-id")}]}

    found, total = efs_api.site_points(Efs(), "fs-0123456789abcdef0", "gf", 2000)
    assert found["a"].id == "fsap-0000000000000000a" and total == 3  # over both pages; a bad id is nobody's


def test_more_sites_than_efs_has_access_points_for_are_refused_before_any_is_made():
    class Efs:
        created = 0

        def __init__(self, existing):
            self.existing = existing

        def describe_access_points(self, **kw):
            return {"AccessPoints": [{"AccessPointId": f"fsap-{i:017x}", "Tags": []} for i in range(self.existing)]}

        def create_access_point(self, **kw):
            Efs.created += 1
            return {"AccessPointId": "fsap-0123456789abcdef0"}

    fs = "fs-0123456789abcdef0"
    with pytest.raises(UsageError, match=r"^the config has 10001 sites, but EFS allows 10000 access points on one"):
        efs_api.ensure_site_points(Efs(0), fs, "gf", [f"s{i}" for i in range(10_001)], 2000)
    with pytest.raises(UsageError, match=r"^2 sites need an access point, but fs-0123456789abcdef0 has 9999 of the"):
        efs_api.ensure_site_points(Efs(9_999), fs, "gf", ["a", "b"], 2000)
    assert Efs.created == 0 and UsageError.exit_code == 2


def test_a_long_site_id_gets_a_root_efs_takes_and_no_other_site_shares():
    long_a, long_b = "a" * 127 + "x", "a" * 127 + "y"
    assert len(efs_api.site_root(long_a)) == 100 and efs_api.site_root(long_a) != efs_api.site_root(long_b)
    assert efs_api.site_root("shop.example") == "/gridfleet/sites/shop.example"
    with pytest.raises(ValueError):
        efs_api.site_root("../etc")
    with pytest.raises(ValueError, match="is not an EFS access point id"):
        efs_api.check_access_point_id("fsap-XYZ")
