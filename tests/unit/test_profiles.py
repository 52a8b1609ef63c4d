"""Per-site profile locks: across real processes, within one process, and Chrome's Singleton* leftovers."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profiles import HeldProfile, ProfileBusy, ProfileStore

REPO = Path(__file__).resolve().parents[2]

# Holds one site until told (a line on stdin) to release it, then waits for EOF.
HOLDER = textwrap.dedent("""
    import os, sys
    from profiles import ProfileStore
    store = ProfileStore(sys.argv[1])
    held = store.acquire(sys.argv[2], 0)
    if len(sys.argv) > 3:
        os.symlink(sys.argv[3], held.path / "SingletonLock")
    print("ready", flush=True)
    sys.stdin.readline()
    held.release()
    print("released", flush=True)
    sys.stdin.readline()
""")

# Tries each site once and reports "<site>:held" or "<site>:busy".
PROBE = textwrap.dedent("""
    import sys
    from profiles import ProfileBusy, ProfileStore
    store = ProfileStore(sys.argv[1])
    for site in sys.argv[2:]:
        try:
            held = store.acquire(site, 0)
        except ProfileBusy:
            print(f"{site}:busy")
        else:
            print(f"{site}:held")
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _read_line(proc: subprocess.Popen, timeout_s: float = 10.0) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise AssertionError("child process did not answer in time")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"child process ended early: {proc.stderr.read()}")
    return line.strip()


class Holder:
    """A child process holding the lock of one site."""

    def __init__(self, root: Path, site: str, singleton_target: str | None = None):
        args = [sys.executable, "-c", HOLDER, str(root), site]
        if singleton_target is not None:
            args.append(singleton_target)
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=REPO,
        )
        assert _read_line(self.proc) == "ready"

    def release(self) -> None:
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()
        assert _read_line(self.proc) == "released"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


def probe(root: Path, *sites: str) -> dict[str, str]:
    """Which of `sites` another process can lock right now ("held") or not ("busy")."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(root), *sites],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=30,
        check=True,
    ).stdout
    return dict(line.split(":") for line in out.split())


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    return ProfileStore(tmp_path)


@pytest.fixture
def holders():
    started: list[Holder] = []

    def start(root: Path, site: str, singleton_target: str | None = None) -> Holder:
        holder = Holder(root, site, singleton_target)
        started.append(holder)
        return holder

    yield start
    for holder in started:
        holder.close()


class FakeClock:
    def __init__(self, on_sleep=None):
        self.now = 100.0
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))


# -- layout and site ids -----------------------------------------------------


def test_layout(tmp_path: Path):
    store = ProfileStore(str(tmp_path))
    assert store.root == tmp_path
    assert store.profile_dir("example.com") == tmp_path / "profiles" / "example.com"
    assert store.lock_path("example.com") == tmp_path / "locks" / "example.com.lock"


@pytest.mark.parametrize("site", ["../x", "a/b", "", ".hidden", "..", "-a", "a b", "a\n", "a" * 129, "/abs"])
def test_invalid_site_ids_are_refused(store: ProfileStore, tmp_path: Path, site: str):
    for call in (store.profile_dir, store.lock_path, lambda s: store.acquire(s, 0)):
        with pytest.raises(ValueError) as err:
            call(site)
        assert repr(site) in str(err.value)
    assert not (tmp_path / "locks").exists()
    assert not (tmp_path / "profiles").exists()


@pytest.mark.parametrize("site", ["a", "A", "9", "example.com", "shop_1-de", "a..b", "a" * 128])
def test_valid_site_ids(store: ProfileStore, site: str):
    with store.acquire(site, 0) as held:
        assert held.path == store.profile_dir(site)


# -- one process -------------------------------------------------------------


def test_acquire_creates_private_profile_dir_and_releases_on_exit(store: ProfileStore):
    with store.acquire("a", 0) as held:
        assert isinstance(held, HeldProfile)
        assert held.site == "a"
        assert held.path.is_dir()
        assert held.path.stat().st_mode & 0o077 == 0
        assert held.removed == ()
        assert store.lock_path("a").exists()
        assert store.held() == ["a"]
    assert store.held() == []


def test_release_is_idempotent(store: ProfileStore):
    held = store.acquire("a", 0)
    held.release()
    held.release()
    again = store.acquire("a", 0)
    held.release()  # a stale handle must not release the new holder's lock
    assert store.held() == ["a"]
    again.release()
    assert store.held() == []


def test_same_process_double_acquire_is_refused(store: ProfileStore, tmp_path: Path):
    first = store.acquire("a", 0)
    with pytest.raises(ProfileBusy, match="this process") as err:
        store.acquire("a", 5, sleep=lambda s: pytest.fail("must not wait"))
    assert err.value.site == "a"
    # The refused attempt must not have opened and closed the lock file, which
    # would silently drop the lock this process holds.
    assert store.held() == ["a"]
    assert probe(tmp_path, "a") == {"a": "busy"}
    first.release()
    assert probe(tmp_path, "a") == {"a": "held"}


def test_releasing_one_site_keeps_the_others(store: ProfileStore, tmp_path: Path):
    a = store.acquire("a", 0)
    b = store.acquire("b", 0)
    assert store.held() == ["a", "b"]
    a.release()
    assert store.held() == ["b"]
    assert probe(tmp_path, "a", "b") == {"a": "held", "b": "busy"}
    b.release()


# -- across processes --------------------------------------------------------


def test_lock_held_by_another_process(store: ProfileStore, tmp_path: Path, holders):
    holder = holders(tmp_path, "a")
    with pytest.raises(ProfileBusy) as err:
        store.acquire("a", 0)
    assert err.value.site == "a"
    assert store.held() == []
    with store.acquire("b", 0):
        assert store.held() == ["b"]
    holder.release()
    with store.acquire("a", 0) as held:
        assert held.site == "a"
        assert store.held() == ["a"]


def test_lock_of_a_killed_process_is_gone(store: ProfileStore, tmp_path: Path, holders):
    holder = holders(tmp_path, "a", singleton_target="otherhost-12345")
    with pytest.raises(ProfileBusy):
        store.acquire("a", 0)
    holder.kill()
    with store.acquire("a", 0) as held:
        assert held.removed == ("SingletonLock",)
        assert not os.path.lexists(held.path / "SingletonLock")


def test_timeout_with_injected_clock(store: ProfileStore, tmp_path: Path, holders):
    holders(tmp_path, "a")
    clock = FakeClock()
    waits = []
    with pytest.raises(ProfileBusy):
        store.acquire(
            "a", 1.0, poll_s=0.25, on_wait=lambda: waits.append(clock.now), monotonic=clock.monotonic, sleep=clock.sleep
        )
    assert clock.sleeps == [0.25, 0.25, 0.25, 0.25]
    assert waits == [100.0, 100.25, 100.5, 100.75]
    assert clock.now == 101.0
    assert store.held() == []


def test_last_sleep_is_clipped_to_the_deadline(store: ProfileStore, tmp_path: Path, holders):
    holders(tmp_path, "a")
    clock = FakeClock()
    with pytest.raises(ProfileBusy):
        store.acquire("a", 0.5, poll_s=0.2, monotonic=clock.monotonic, sleep=clock.sleep)
    assert clock.sleeps == pytest.approx([0.2, 0.2, 0.1])


def test_timeout_zero_is_a_single_try(store: ProfileStore, tmp_path: Path, holders):
    holders(tmp_path, "a")
    clock = FakeClock()
    with pytest.raises(ProfileBusy):
        store.acquire(
            "a", 0, on_wait=lambda: pytest.fail("no wait expected"), monotonic=clock.monotonic, sleep=clock.sleep
        )
    assert clock.sleeps == []


def test_waits_until_the_other_process_releases(store: ProfileStore, tmp_path: Path, holders):
    holder = holders(tmp_path, "a")
    clock = FakeClock(on_sleep=lambda n: holder.release() if n == 2 else None)
    waits = []
    with store.acquire(
        "a", 60, poll_s=1, on_wait=lambda: waits.append(1), monotonic=clock.monotonic, sleep=clock.sleep
    ) as held:
        assert held.site == "a"
    assert clock.sleeps == [1, 1]
    assert len(waits) == 2


def test_failed_wait_leaves_nothing_behind(store: ProfileStore, tmp_path: Path, holders):
    holder = holders(tmp_path, "a")
    clock = FakeClock()
    with pytest.raises(ProfileBusy):
        store.acquire("a", 0.4, monotonic=clock.monotonic, sleep=clock.sleep)
    holder.release()
    with store.acquire("a", 0):
        assert store.held() == ["a"]


# -- Chrome's Singleton* entries ---------------------------------------------


def test_singleton_entries_are_removed_after_locking(store: ProfileStore, tmp_path: Path):
    profile = store.profile_dir("a")
    (profile / "Default").mkdir(parents=True)
    (profile / "Default" / "Preferences").write_text("{}")
    (profile / "Local State").write_text("{}")
    (profile / "NotSingletonLock").write_text("keep")
    (profile / "Default" / "SingletonLock").write_text("only top-level entries go")
    outside = tmp_path / "outside"
    outside.write_text("target of a symlink")
    os.symlink("otherhost-12345", profile / "SingletonLock")  # dangling
    os.symlink(str(tmp_path / "gone" / "socket"), profile / "SingletonSocket")  # dangling
    os.symlink(str(outside), profile / "SingletonCookie")  # to a real file: never followed
    (profile / "SingletonExtra").write_text("")

    with store.acquire("a", 0) as held:
        assert held.removed == ("SingletonCookie", "SingletonExtra", "SingletonLock", "SingletonSocket")
        for name in held.removed:
            assert not os.path.lexists(profile / name)
        assert (profile / "Local State").read_text() == "{}"
        assert (profile / "NotSingletonLock").read_text() == "keep"
        assert (profile / "Default" / "Preferences").exists()
        assert (profile / "Default" / "SingletonLock").exists()
        assert outside.read_text() == "target of a symlink"


def test_singleton_entries_stay_while_another_process_holds_the_lock(store: ProfileStore, tmp_path: Path, holders):
    holder = holders(tmp_path, "a", singleton_target="thishost-999")
    link = store.profile_dir("a") / "SingletonLock"
    with pytest.raises(ProfileBusy):
        store.acquire("a", 0)
    assert os.readlink(link) == "thishost-999"
    holder.release()
    with store.acquire("a", 0) as held:
        assert held.removed == ("SingletonLock",)
        assert not os.path.lexists(link)


# --- profiles for a browser of another user -----------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
CRAWL = (2345, 2346)  # (uid, gid) of a browser's user; no such user needs to exist


@needs_root
def test_a_store_with_an_owner_gives_new_profiles_to_it(tmp_path):
    store = ProfileStore(tmp_path, owner=CRAWL)
    with store.acquire("site-a", 0) as held:
        st = held.path.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (*CRAWL, 0o700)
    lock = store.lock_path("site-a").stat()
    assert (lock.st_uid, lock.st_gid) == (os.geteuid(), os.getegid())  # the lock stays the holder's


@needs_root
def test_a_profile_left_by_another_user_is_given_to_the_owner_whole(tmp_path):
    profile = tmp_path / "profiles" / "site-a"
    (profile / "Default" / "Cache").mkdir(parents=True)
    (profile / "Default" / "Cookies").write_text("c")
    (profile / "SingletonLock").symlink_to("elsewhere-123")
    (profile / "Default" / "link").symlink_to("/etc/passwd")  # a symlink is given itself, never followed
    with ProfileStore(tmp_path, owner=CRAWL).acquire("site-a", 0) as held:
        assert held.removed == ("SingletonLock",)
    for path in (
        profile,
        profile / "Default",
        profile / "Default" / "Cache",
        profile / "Default" / "Cookies",
        profile / "Default" / "link",
    ):
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == CRAWL, path
    assert os.stat("/etc/passwd").st_uid == 0


def test_a_store_without_an_owner_leaves_ownership_alone(tmp_path):
    with ProfileStore(tmp_path).acquire("site-a", 0) as held:
        st = held.path.stat()
        assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid())


# -- a site's own directory (AWS: mounted for its crawl) ------------------------------------------------------------


def test_the_per_site_layout_keeps_the_lock_beside_the_profile_in_the_sites_directory(tmp_path: Path):
    store = ProfileStore(tmp_path, per_site=True)
    assert store.profile_dir("example.com") == tmp_path / "example.com" / "profile"
    assert store.lock_path("example.com") == tmp_path / "example.com" / ".lock"
    (tmp_path / "example.com").mkdir()  # what the site-mount helper mounted
    with store.acquire("example.com", 0) as held:
        assert held.path == tmp_path / "example.com" / "profile" and held.path.is_dir()
        assert sorted(p.name for p in (tmp_path / "example.com").iterdir()) == [".lock", "profile"]
        with pytest.raises(ProfileBusy):  # one lock object per site for the whole crawl, as in one directory
            store.acquire("example.com", 0)
        other = subprocess.run(  # another process (another node, on EFS) locks the same file: refused
            [sys.executable, "-c", PER_SITE_PROBE, str(tmp_path)], capture_output=True, text=True, env=_env(),
            cwd=REPO, timeout=30, check=True,
        ).stdout  # fmt: skip
        assert other.strip() == "busy"
    assert store.held() == []


def test_a_site_whose_directory_is_not_mounted_is_not_made_under_the_mount_points(tmp_path: Path):
    """The site's directory is its mount: an acquire without it fails, and makes nothing where the mount goes."""
    store = ProfileStore(tmp_path, per_site=True)
    with pytest.raises(FileNotFoundError):
        store.acquire("example.com", 0)
    assert list(tmp_path.iterdir()) == [] and store.held() == []


PER_SITE_PROBE = """
import sys
from profiles import ProfileBusy, ProfileStore
try:
    ProfileStore(sys.argv[1], per_site=True).acquire("example.com", 0)
    print("held")
except ProfileBusy:
    print("busy")
"""
