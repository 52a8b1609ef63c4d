"""Per-site Chrome profiles guarded by a cross-process lock; see `profiles.store`."""

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
    "SITE_ID_RE",
    "HeldProfile",
    "ProfileBusy",
    "ProfileStore",
    "check_site_id",
    "give_to",
    "remove_singletons",
]
