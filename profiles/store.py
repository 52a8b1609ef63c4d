"""Per-site Chrome profiles on a shared file system, one Chrome at a time.

Each site has a persistent Chrome user-data-dir and a lock file under a root
directory. On one machine every site's are in one local directory::

    <root>/profiles/<site>      the profile (user-data-dir) of the site
    <root>/locks/<site>.lock    the lock file guarding it

On AWS (``per_site``) each site has a directory of its own on EFS, which root
mounts at ``<root>/<site>`` for the crawl that claimed the site and unmounts
after it (`profiles.mounts`), so that a crawl sees no other site's files; the
lock is inside that directory, beside the profile::

    <root>/<site>/profile       the profile of the site
    <root>/<site>/.lock         the lock file guarding it

An NFS lock is the server's, per file: two nodes that mount the same site's
directory lock the same file, and exclude each other as with one directory.

Several node processes, possibly on several hosts, may be asked to crawl the
same site; `ProfileStore.acquire` takes the site's lock so that only one of
them runs a Chrome on the profile, and gives it back as a `HeldProfile`.

How the lock behaves (read this before touching lock files)
-----------------------------------------------------------
The lock is a POSIX ``fcntl`` record lock (``fasteners.InterProcessLock``).
Such a lock belongs to the *process*, not to a file descriptor or a thread:

* It is dropped as soon as *any* file descriptor of the lock file is closed
  in the holding process, even one opened elsewhere for an unrelated reason.
  Hold exactly one `HeldProfile` per site for the whole crawl, and never open
  (and close) a lock file under ``<root>/locks`` anywhere else in a process.
* A second ``fcntl`` lock of the same file by the same process *succeeds*, so
  the kernel cannot stop a process from locking a site twice. The store keeps
  a per-process registry of the sites it holds (or is acquiring) and refuses
  a second acquire with `ProfileBusy` without opening the file again.
* It is released by the kernel when the process dies, however it dies, so a
  host or process that crashed mid-crawl never leaves a stale lock behind.
  (On NFS/EFS the server reclaims it once the dead client's lease expires.)
* A child made by ``fork`` does not inherit the parent's locks.

What a dead holder does leave behind is Chrome's ``SingletonLock`` (a symlink
to ``hostname-pid``), ``SingletonSocket`` and ``SingletonCookie``, which make
the next Chrome refuse the profile. Once the lock is held, and only then,
`acquire` removes every ``Singleton*`` entry directly inside the profile
directory, without following symlinks, and reports what it removed.

Chrome may run as another user than the process holding the lock (a root node
agent whose browser runs as an unprivileged user). A store made with an
``owner`` gives each profile directory it hands out to that uid and gid,
including one an earlier run left owned by someone else.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import fasteners

__all__ = [
    "HeldProfile",
    "ProfileBusy",
    "ProfileStore",
    "SITE_ID_RE",
    "check_site_id",
    "give_to",
    "remove_singletons",
]

#: What a site id may look like; anything else could name a path outside the root.
SITE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: Prefix of the entries Chrome leaves in a profile to claim it for one process.
SINGLETON_PREFIX = "Singleton"

PROFILE_DIR_MODE = 0o700


def check_site_id(site: str) -> str:
    """Return `site` if it is a valid site id, else raise ValueError naming it."""
    if not isinstance(site, str) or SITE_ID_RE.fullmatch(site) is None:
        raise ValueError(f"invalid site id {site!r}: must match {SITE_ID_RE.pattern}")
    return site


class ProfileBusy(Exception):
    """The site's profile lock is held elsewhere (or already by this process) past the wait."""

    def __init__(self, site: str, message: str | None = None):
        self.site = site
        super().__init__(message or f"profile of site {site!r} is locked by another process")


@dataclass(frozen=True)
class HeldProfile:
    """A site's profile whose lock this process holds until `release`."""

    site: str
    path: Path
    removed: tuple[str, ...] = ()
    _release: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    def release(self) -> None:
        """Release the lock. Calling it again does nothing."""
        self._release()

    def __enter__(self) -> HeldProfile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release()


class _Slot:
    """One site in the registry: being acquired, then held, until released."""

    __slots__ = ("lock_path", "lock", "held", "released")

    def __init__(self, lock_path: Path):
        self.lock_path = lock_path
        self.lock = fasteners.InterProcessLock(lock_path)
        self.held = False
        self.released = False


class ProfileStore:
    """The profiles and lock files under one root directory."""

    def __init__(self, root: str | Path, owner: tuple[int, int] | None = None, *, per_site: bool = False):
        self.root = Path(root)
        self.owner = owner  # (uid, gid) the profile directories belong to; None: whoever makes them
        self.per_site = per_site  # each site in a directory of its own, <root>/<site>, mounted for its crawl
        self._mutex = threading.Lock()
        self._slots: dict[str, _Slot] = {}

    # -- layout --------------------------------------------------------------

    def profile_dir(self, site: str) -> Path:
        if self.per_site:
            return self.root / check_site_id(site) / "profile"
        return self.root / "profiles" / check_site_id(site)

    def lock_path(self, site: str) -> Path:
        if self.per_site:
            return self.root / check_site_id(site) / ".lock"
        return self.root / "locks" / f"{check_site_id(site)}.lock"

    # -- locking -------------------------------------------------------------

    def held(self) -> list[str]:
        """The sites whose lock this process holds now, sorted."""
        with self._mutex:
            return sorted(site for site, slot in self._slots.items() if slot.held)

    def acquire(
        self,
        site: str,
        timeout_s: float,
        *,
        poll_s: float = 0.2,
        on_wait: Callable[[], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> HeldProfile:
        """Lock the site's profile, waiting up to `timeout_s` seconds.

        The lock is tried without blocking; while another process holds it,
        `on_wait` is called (so the caller can keep heartbeating) and the
        store sleeps `poll_s`, until `timeout_s` has passed on `monotonic`,
        and then raises `ProfileBusy`. ``timeout_s == 0`` is a single try.
        A site this process already holds (or is acquiring in another thread)
        raises `ProfileBusy` at once.

        Once locked, the profile directory is created if missing and its
        ``Singleton*`` entries are removed; their names are in
        `HeldProfile.removed`.
        """
        check_site_id(site)
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")

        if self.per_site and not self.lock_path(site).parent.is_dir():  # its mount: never made here (fasteners would)
            raise FileNotFoundError(f"{self.lock_path(site).parent} is not there: the site's directory is not mounted")
        slot = self._reserve(site)
        try:
            if not self.per_site:
                slot.lock_path.parent.mkdir(parents=True, exist_ok=True)
            self._wait_for_lock(site, slot.lock, timeout_s, poll_s, on_wait, monotonic, sleep)
        except BaseException:
            _close_lock_file(slot.lock)
            with self._mutex:
                self._slots.pop(site, None)
            raise

        profile = self.profile_dir(site)
        try:
            removed = self._make_ready(profile)
        except BaseException:
            self._release(site, slot)
            raise

        with self._mutex:
            slot.held = True
        return HeldProfile(site=site, path=profile, removed=removed, _release=lambda: self._release(site, slot))

    def _reserve(self, site: str) -> _Slot:
        """The site's slot in the registry, taken before the lock file is opened, so that no other thread of this
        process can open (and later close) it meanwhile; ProfileBusy if the process holds or is acquiring it."""
        slot = _Slot(self.lock_path(site))
        with self._mutex:
            if site in self._slots:
                raise ProfileBusy(site, f"profile of site {site!r} is already held by this process")
            self._slots[site] = slot
        return slot

    def _make_ready(self, profile: Path) -> tuple[str, ...]:
        """Create the locked profile's directory if missing, clear a dead Chrome's Singleton* entries (their
        names are returned) and give it to the store's owner."""
        profile.parent.mkdir(parents=True, exist_ok=True)
        profile.mkdir(mode=PROFILE_DIR_MODE, exist_ok=True)
        removed = remove_singletons(profile)
        if self.owner is not None:
            give_to(profile, *self.owner)
        return removed

    @staticmethod
    def _wait_for_lock(
        site: str,
        lock: fasteners.InterProcessLock,
        timeout_s: float,
        poll_s: float,
        on_wait: Callable[[], None] | None,
        monotonic: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        deadline = monotonic() + timeout_s
        while True:
            # The same lock object (and file descriptor) is reused across tries.
            if lock.acquire(blocking=False):
                return
            remaining = deadline - monotonic()
            if remaining <= 0:
                raise ProfileBusy(
                    site, f"profile of site {site!r} is locked by another process (waited {timeout_s:g}s)"
                )
            if on_wait is not None:
                on_wait()
            sleep(min(poll_s, remaining))

    def _release(self, site: str, slot: _Slot) -> None:
        with self._mutex:
            if slot.released:
                return
            slot.released = True
            slot.held = False
        try:
            # Unlocks and closes the one descriptor of the lock file. The site
            # stays reserved until it is closed: a new acquire in this process
            # must not open the file while this descriptor is still open.
            if slot.lock.acquired:
                slot.lock.release()
            else:
                _close_lock_file(slot.lock)
        finally:
            with self._mutex:
                if self._slots.get(site) is slot:
                    del self._slots[site]


def _close_lock_file(lock: fasteners.InterProcessLock) -> None:
    """Close a lock file left open by a failed try (it holds no lock of ours)."""
    handle = lock.lockfile
    lock.lockfile = None
    if handle is not None and not handle.closed:
        handle.close()


def give_to(profile: Path, uid: int, gid: int, walk: bool = False) -> None:
    """Make `profile` and everything in it belong to `uid`:`gid` (symlinks themselves, never followed).

    Nothing is walked when the directory already belongs to them, so this costs
    one stat per crawl once a profile has been given; `walk` walks it anyway
    (another user may have made files in it since).
    """
    st = os.lstat(profile)
    if (st.st_uid, st.st_gid) == (uid, gid) and not walk:
        return
    for top, dirs, files in os.walk(profile):
        for name in dirs + files:
            os.lchown(os.path.join(top, name), uid, gid)
    os.lchown(profile, uid, gid)


def remove_singletons(profile: Path) -> tuple[str, ...]:
    """Remove the ``Singleton*`` entries directly inside `profile`; return their names.

    Symlinks are removed themselves, never followed (``SingletonLock`` usually
    points to a ``hostname-pid`` that does not exist). Only call this while
    holding the site's lock: these entries belong to a running Chrome otherwise.
    """
    removed = []
    with os.scandir(profile) as entries:
        candidates = [e for e in entries if e.name.startswith(SINGLETON_PREFIX)]
    for entry in sorted(candidates, key=lambda e: e.name):
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except FileNotFoundError:
            continue
        removed.append(entry.name)
    return tuple(removed)
