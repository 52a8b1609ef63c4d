"""Chromium's sandbox follows the user Chromium runs as: the node decides, once, and its Grid node runs as that user."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from fleet.errors import SandboxUnavailable
from fleet.grid_auth import GridSecret
from node import browser
from node import main as node_main
from node.grid_node import GridNode, GridNodeSpec, RunAs

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
NOBODY = "nobody"  # a user every Debian system has, standing in for the crawl user


def test_the_crawler_adds_no_sandbox_flag_of_its_own_whoever_runs_it():
    args = browser.chrome_args(Path("/efs/profiles/a"))
    assert browser.NO_SANDBOX not in args and "--user-data-dir=/efs/profiles/a" in args
    assert browser.chrome_args(Path("/p"), ("--no-sandbox", "--lang=ko"))[-2:] == ["--no-sandbox", "--lang=ko"]


def test_root_never_gets_the_sandbox():
    assert "root" in browser.sandbox_problem(0, 0)


@pytest.mark.parametrize(
    "switch, value, denied",
    [
        ("user/max_user_namespaces", "0", True),
        ("user/max_user_namespaces", "15000", False),
        ("kernel/unprivileged_userns_clone", "0", True),
        ("kernel/unprivileged_userns_clone", "1", False),
        ("kernel/apparmor_restrict_unprivileged_userns", "1", True),
        ("kernel/apparmor_restrict_unprivileged_userns", "0", False),
    ],
)
def test_kernel_switches_that_deny_user_namespaces(tmp_path, switch, value, denied):
    (tmp_path / switch).parent.mkdir(parents=True)
    (tmp_path / switch).write_text(value + "\n")
    problem = browser.sandbox_problem(2000, 2000, sysctl_dir=tmp_path, probe=False)
    if denied:
        assert problem == f"the kernel denies unprivileged user namespaces ({switch.replace('/', '.')} = {value})"
    else:
        assert problem is None


def probe_user() -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    u = RunAs.lookup(NOBODY)
    return u.uid, u.gid


def test_the_real_probe_finds_user_namespaces_allowed_here():
    """This machine lets unprivileged users make user namespaces (Chromium, run as one, keeps its sandbox)."""
    assert browser.sandbox_problem(*probe_user()) is None


def test_a_probe_that_is_refused_denies_the_sandbox(open_dir, monkeypatch):
    # The seam: an `unshare` that fails as it does under a seccomp filter no kernel switch shows.
    fake = open_dir / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{open_dir}:{os.environ['PATH']}")
    uid, gid = probe_user()
    problem = browser.sandbox_problem(uid, gid, sysctl_dir=open_dir / "none")
    assert problem == f"user namespaces are denied to uid {uid}: unshare: unshare failed: Operation not permitted"


def test_the_node_adds_no_sandbox_only_when_chromium_cannot_have_it_said_once(caplog):
    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        if os.geteuid() == 0:  # a root node's own Chromium, on the embedded default when fleet.yaml allows it
            assert node_main.sandbox_args(None, on_aws=False, allow_no_sandbox=True) == (browser.NO_SANDBOX,)
            assert node_main.sandbox_args(RunAs.lookup(NOBODY), on_aws=True, allow_no_sandbox=False) == ()
        else:
            assert node_main.sandbox_args(None, on_aws=True, allow_no_sandbox=False) == ()
    events = [(r.levelno, r.fields["sandbox"]) for r in caplog.records if getattr(r, "event", "") == "chromium-sandbox"]
    assert events == ([(logging.WARNING, "off"), (logging.INFO, "on")] if os.geteuid() == 0 else [(logging.INFO, "on")])


@pytest.mark.parametrize(
    "on_aws, allow, flags, level, said",
    [
        (False, True, (browser.NO_SANDBOX,), logging.WARNING, "off"),
        (False, False, None, logging.ERROR, "refused"),
        (True, True, None, logging.ERROR, "refused"),
        (True, False, None, logging.ERROR, "refused"),
    ],
    ids=["embedded-allowed", "embedded-not-allowed", "aws-allowed", "aws"],
)
def test_without_its_sandbox_chromium_runs_only_on_the_embedded_default_when_fleet_yaml_allows_it(
    caplog, monkeypatch, on_aws, allow, flags, level, said
):
    """The seam: `node.browser.sandbox_problem`, the one probe of the sandbox, says it is unavailable."""
    problem = "user namespaces are denied to uid 2000: unshare: Operation not permitted"
    monkeypatch.setattr(browser, "sandbox_problem", lambda *a, **k: problem)
    with caplog.at_level(logging.INFO, logger="gridfleet.node"):
        if flags is None:
            with pytest.raises(SandboxUnavailable, match="^Chromium cannot have its sandbox: user namespaces are"):
                node_main.sandbox_args(None, on_aws=on_aws, allow_no_sandbox=allow)
        else:
            assert node_main.sandbox_args(None, on_aws=on_aws, allow_no_sandbox=allow) == flags
    [record] = [r for r in caplog.records if getattr(r, "event", "") == "chromium-sandbox"]
    assert (record.levelno, record.fields["sandbox"], record.fields["reason"]) == (level, said, problem)


def test_the_grid_user_is_one_the_node_can_switch_to(caplog):
    with caplog.at_level(logging.WARNING, logger="gridfleet.node"):
        assert node_main.grid_user(None) is None
        assert node_main.grid_user("no-such-user-gf") is None
    assert [getattr(r, "event", "") for r in caplog.records] == ["grid-user-missing"]
    if os.geteuid() == 0:
        assert node_main.grid_user(NOBODY) == RunAs.lookup(NOBODY)
        assert node_main.grid_user("root") is None  # already this process's user


@needs_root
def test_the_grid_node_runs_as_its_user_with_a_home_of_its_own(open_dir, monkeypatch):
    # The seam: a `java` that reports who it runs as instead of starting the Grid node.
    java = open_dir / "java"
    java.write_text(
        '#!/bin/sh\nid -u; id -g; echo "$HOME"; pwd; echo "mark=$GRIDFLEET_INSTANCE"\n'
        'echo "xdg=${XDG_RUNTIME_DIR:-}"; head -n 1 "$(echo "$@" | sed "s/.*--config //")"; exit 3\n'
    )
    java.chmod(0o755)
    monkeypatch.setenv("GRIDFLEET_INSTANCE", "i-local-1")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/0")
    state = open_dir / "state"
    state.mkdir(mode=0o700)
    user = RunAs.lookup(NOBODY)
    spec = GridNodeSpec(
        jar=open_dir / "selenium.jar",
        grid_url="http://127.0.0.1:9",
        publish="tcp://127.0.0.1:9",
        subscribe="tcp://127.0.0.1:9",
        java=str(java),
        port=5999,
        secret=GridSecret.make(),
    )
    node = GridNode(spec, "i-local-1", state, run_as=user)
    with pytest.raises(RuntimeError, match="Grid node exited with 3"):
        node.start(timeout_s=10)
    said = (state / "grid-node.log").read_text().splitlines()
    home = state / "grid-home"
    assert said == [str(user.uid), str(user.gid), str(home), str(home), "mark=i-local-1", "xdg=", "[server]"]
    st = home.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (user.uid, 0o700)
    toml = (state / "grid-node.toml").stat()  # it holds the registration secret: that user's alone
    assert (toml.st_uid, toml.st_mode & 0o777) == (user.uid, 0o600)


def test_the_grid_node_of_this_user_changes_nothing(tmp_path):
    spec = GridNodeSpec(
        jar=tmp_path / "j.jar",
        grid_url="http://127.0.0.1:9",
        publish="tcp://127.0.0.1:9",
        subscribe="tcp://127.0.0.1:9",
        java="false",
        port=5999,
    )
    node = GridNode(spec, "i-local-1", tmp_path)
    with pytest.raises(RuntimeError, match="Grid node exited with 1"):
        node.start(timeout_s=10)
    assert not (tmp_path / "grid-home").exists()
