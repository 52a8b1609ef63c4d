"""EFS: every site's own access point, which the hub makes and the nodes' site-mount helper looks up.

A crawl sees its own site's files only: each site of a run's config has an access point rooted at a directory
of that site alone (`site_root`, `/gridfleet/sites/<site>`, which EFS creates on the first mount as the crawl
user's, mode 0700), whose POSIX user is the crawl user, tagged with the stack and the site
(`fleet.record.tags.site_tags`). The hub makes the missing ones at the start of a run (`ensure_site_points`); a later
run, or the same run resumed, finds them again by their tags. Nothing here relies on a creation token: moto
ignores ClientToken, and the tags are what the nodes go by anyway. Two access points of one site (two hubs that
raced) open the same directory; everyone takes the one of the lowest id. One whose root or POSIX user is not
what the site's must be (made by hand, or for another crawl uid) is nobody's: it is counted, never used.

EFS takes at most `MAX_ACCESS_POINTS` access points a file system: a config with more sites is refused before
anything is made or launched, and so is a run whose new sites would pass the limit with the ones already there.
Every access point id read back is checked (`fsap-` and hex) before it goes into a mount option or a log line.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code
from fleet.errors import UsageError, quote
from fleet.record.ids import check_site_id
from fleet.record.tags import TAG_SITE, TAG_STACK, site_tags, tags_of

__all__ = [
    "ACCESS_POINT_ID_RE",
    "MAX_ACCESS_POINTS",
    "SITES_ROOT",
    "SiteAccessPoint",
    "check_access_point_id",
    "check_site_count",
    "ensure_site_points",
    "find_site_point",
    "site_points",
    "site_root",
]

#: An EFS access point id, as EFS's API model spells it.
ACCESS_POINT_ID_RE = re.compile(r"fsap-[0-9a-f]{8,40}")

#: Access points EFS allows on one file system (its quota; an increase can be asked for).
MAX_ACCESS_POINTS = 10_000

#: Under which directory of the file system each site's own directory lies.
SITES_ROOT = "/gridfleet/sites"

#: The mode EFS gives a site's directory when it creates it: the crawl user's alone.
SITE_DIR_MODE = "0700"

#: The longest root directory EFS takes (its API model: 100 characters).
_ROOT_MAX = 100

#: A site id is up to 128 characters; a longer one than fits is cut and keeps a digest of the whole.
_DIGEST_CHARS = 16

#: Access points made at once at a run's start (a first run of many sites makes them all).
_CREATE_WORKERS = 4


def check_access_point_id(value: object, what: str = "access point id") -> str:
    """`value` if it is an EFS access point id, else ValueError naming it."""
    if not isinstance(value, str) or ACCESS_POINT_ID_RE.fullmatch(value) is None:
        raise ValueError(f"{what} {quote(value)} is not an EFS access point id ('fsap-' and 8 to 40 hex digits)")
    return value


def site_root(site: str) -> str:
    """The root directory of the site's access point: `/gridfleet/sites/<site>`, or, for an id too long for
    EFS's 100 characters, its start and a digest of the whole id (two sites never share a directory)."""
    check_site_id(site)
    whole = f"{SITES_ROOT}/{site}"
    if len(whole) <= _ROOT_MAX:
        return whole
    digest = hashlib.sha256(site.encode()).hexdigest()[:_DIGEST_CHARS]
    keep = _ROOT_MAX - len(SITES_ROOT) - 2 - _DIGEST_CHARS
    return f"{SITES_ROOT}/{site[:keep]}-{digest}"


def check_site_count(sites: int, efs_id: str) -> None:
    """UsageError when a config has more sites than EFS has access points for on its one file system."""
    if sites > MAX_ACCESS_POINTS:
        raise UsageError(
            f"the config has {sites} sites, but EFS allows {MAX_ACCESS_POINTS} access points on one file system "
            f"({efs_id}) and each site needs its own: split the sites across stacks"
        )


@dataclass(frozen=True)
class SiteAccessPoint:
    """A site's access point, as read back and checked."""

    id: str
    site: str
    file_system_id: str
    root: str
    uid: int
    gid: int


def _of_efs(raw: Mapping[str, Any], stack: str, uid: int) -> SiteAccessPoint | None:
    """The site's access point that `raw` (DescribeAccessPoints) is, or None when it is not one of the stack's
    sites' as gridfleet makes them (its root that site's, its POSIX user the crawl user)."""
    tags = tags_of(dict(raw))
    site = tags.get(TAG_SITE)
    if tags.get(TAG_STACK) != stack or site is None:
        return None
    try:
        point = check_access_point_id(raw.get("AccessPointId"), "access point id from DescribeAccessPoints")
        root = site_root(check_site_id(site, f"{TAG_SITE} tag of {point}"))
    except ValueError:
        return None  # a tag no site id can be: made by hand, never ours
    posix = raw.get("PosixUser") or {}
    if (raw.get("RootDirectory") or {}).get("Path") != root or (posix.get("Uid"), posix.get("Gid")) != (uid, uid):
        return None
    return SiteAccessPoint(point, site, str(raw.get("FileSystemId")), root, uid, uid)


def _listing(efs: Any, efs_id: str) -> Iterator[Mapping[str, Any]]:
    """Every access point of the file system, over all of DescribeAccessPoints' pages."""
    kwargs: dict[str, Any] = {"FileSystemId": efs_id}
    while True:
        page = efs.describe_access_points(**kwargs)
        yield from page.get("AccessPoints", [])
        token = page.get("NextToken")
        if not token:
            return
        kwargs["NextToken"] = token


def site_points(efs: Any, efs_id: str, stack: str, uid: int) -> tuple[dict[str, SiteAccessPoint], int]:
    """The stack's sites' access points on the file system (site -> the one of the lowest id), and how many
    access points the file system has in all (any stack's, any purpose's: they all count against its limit)."""
    found: dict[str, SiteAccessPoint] = {}
    total = 0
    for raw in _listing(efs, efs_id):
        total += 1
        point = _of_efs(raw, stack, uid)
        if point is not None and (point.site not in found or point.id < found[point.site].id):
            found[point.site] = point
    return found, total


def find_site_point(efs: Any, efs_id: str, stack: str, site: str, uid: int) -> SiteAccessPoint | None:
    """The site's access point on the file system, or None if it has none."""
    return site_points(efs, efs_id, stack, uid)[0].get(site)


def _create(efs: Any, efs_id: str, stack: str, site: str, uid: int) -> SiteAccessPoint:
    root = site_root(site)
    try:
        out = efs.create_access_point(
            FileSystemId=efs_id,
            PosixUser={"Uid": uid, "Gid": uid},
            RootDirectory={
                "Path": root,
                "CreationInfo": {"OwnerUid": uid, "OwnerGid": uid, "Permissions": SITE_DIR_MODE},
            },
            Tags=site_tags(stack, site),
        )
    except ClientError as e:
        if error_code(e) == "AccessPointLimitExceeded":
            raise UsageError(
                f"EFS refused an access point for site {site!r} on {efs_id}: the file system has its "
                f"{MAX_ACCESS_POINTS} already (sites no config names any more keep theirs: delete those)"
            ) from None
        raise
    point = check_access_point_id(out.get("AccessPointId"), "access point id from CreateAccessPoint")
    return SiteAccessPoint(point, site, efs_id, root, uid, uid)


def ensure_site_points(
    efs: Any, efs_id: str, stack: str, sites: Iterable[str], uid: int
) -> tuple[dict[str, str], list[str]]:
    """Every site of `sites` has its access point on the file system, made where missing: site -> the id of
    the one it has, and the sites whose access point was made now. UsageError, before any is made, when the
    missing ones would pass EFS's limit."""
    wanted = list(dict.fromkeys(check_site_id(s) for s in sites))
    check_site_count(len(wanted), efs_id)
    found, total = site_points(efs, efs_id, stack, uid)
    missing = [s for s in wanted if s not in found]
    if total + len(missing) > MAX_ACCESS_POINTS:
        raise UsageError(
            f"{len(missing)} sites need an access point, but {efs_id} has {total} of the {MAX_ACCESS_POINTS} "
            "EFS allows a file system (sites no config names any more keep theirs: delete those)"
        )
    with ThreadPoolExecutor(max_workers=_CREATE_WORKERS) as pool:
        made = list(pool.map(lambda s: _create(efs, efs_id, stack, s, uid), missing))
    return {s: found[s].id for s in wanted if s in found} | {p.site: p.id for p in made}, missing
