"""Per-site Chrome profiles guarded by a cross-process lock (`profiles.store`), and the mount of a site's own
directory for its crawl (`profiles.mounts`)."""

from profiles.mounts import NO_MOUNTS, NoMounts, SiteMountFailed, SiteMounts, SocketMounts
from profiles.store import (
    SITE_ID_RE,
    HeldProfile,
    ProfileBusy,
    ProfileStore,
    check_site_id,
    give_to,
    remove_singletons,
)

__all__ = [
    "NO_MOUNTS",
    "NoMounts",
    "SiteMountFailed",
    "SiteMounts",
    "SocketMounts",
    "SITE_ID_RE",
    "HeldProfile",
    "ProfileBusy",
    "ProfileStore",
    "check_site_id",
    "give_to",
    "remove_singletons",
]
