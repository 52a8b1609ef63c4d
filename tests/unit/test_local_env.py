"""The config the embedded default gives its nodes, its home, and the user its nodes run Chromium as."""

import logging
import os
from pathlib import Path

import pytest

from cli.envs.crawl_user import reach_crawl_user
from cli.envs.home import ROOT_HOME, gridfleet_home
from cli.envs.local import LocalEnv, effective_config
from cli.main import main
from embedded.stack import Component, LocalStack, StackState
from fleet.config import Config
from fleet.grid_auth import GridSecret
from node import browser

SECRET = GridSecret.make()

STATE = StackState(
    "sid",
    "/tmp/x",
    None,
    {
        "moto": Component("moto", 1, None, "http://127.0.0.1:5000"),
        "grid": Component("grid", 2, None, "http://127.0.0.1:4444", {"publish": 4442, "subscribe": 4443}),
        "demo": Component("demo", 3, None, "http://127.0.0.1:8800"),
    },
    0.0,
)


def config(**kw):
    return Config.model_validate(
        {"sites": [{"id": "a", "start_url": "{demo}/s/a/?pages=2"}, {"id": "b", "start_url": "https://b.test/"}], **kw}
    )


def test_demo_urls_and_the_moto_endpoint_are_filled_in():
    eff = effective_config(config(), STATE, cpus=2)
    assert eff.site("a").start_url == "http://127.0.0.1:8800/s/a/?pages=2"
    assert eff.site("b").start_url == "https://b.test/"
    assert eff.aws.endpoint_url == "http://127.0.0.1:5000"


def test_local_nodes_are_capped_by_the_machine_unless_configured():
    assert effective_config(config(fleet={"max_nodes": 20}), STATE, cpus=2).fleet.max_nodes == 4
    assert effective_config(config(fleet={"max_nodes": 3}), STATE, cpus=2).fleet.max_nodes == 3
    capped = config(fleet={"max_nodes": 20}, local={"max_nodes": 12})
    assert effective_config(capped, STATE, cpus=2).fleet.max_nodes == 12


# --- GRIDFLEET_HOME and the crawl user ----------------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
USER = "nobody"  # a user every Debian system has, standing in for fleet.crawl_user


def test_gridfleet_home_is_under_var_lib_for_root_and_the_home_directory_otherwise():
    assert gridfleet_home({}, euid=0) == ROOT_HOME == Path("/var/lib/gridfleet")
    assert gridfleet_home({}, euid=1000) == Path.home() / ".gridfleet"
    assert gridfleet_home({"GRIDFLEET_HOME": "/srv/gf"}, euid=0) == Path("/srv/gf")


def local_env(stack: LocalStack, crawl_user: str, **kw) -> LocalEnv:
    state = StackState(
        "sid",
        str(stack.dir),
        None,
        {**STATE.components, "imds": Component("imds", 4, None, "http://127.0.0.1:8169")},
        0.0,
        grid_secret=SECRET.value,
    )
    return LocalEnv(config(fleet={"crawl_user": crawl_user}, **kw), stack=stack, state=state)


def make_jar(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    jar = d / "selenium-server-4.48.0.jar"
    jar.write_bytes(b"jar" * 100)
    jar.chmod(0o644)
    return jar


def test_nobody_is_switched_to_unless_root(open_dir):
    stack = LocalStack(open_dir / "home")
    assert reach_crawl_user(USER, stack, make_jar(open_dir / "vendor"), euid=1000) == (None, None)


@needs_root
def test_a_reachable_crawl_user_is_used_with_the_jar_where_it_is(open_dir):
    stack = LocalStack(open_dir / "home")
    jar = make_jar(open_dir / "vendor")
    user, problem = reach_crawl_user(USER, stack, jar)
    assert problem is None
    assert (user.name, user.uid, user.grid_jar) == (USER, 65534, jar)
    assert stack.instances_dir.is_dir() and (stack.efs_root / "profiles").is_dir()


@needs_root
def test_a_jar_the_user_cannot_read_is_copied_beside_the_nodes_state(open_dir, tmp_path):
    stack = LocalStack(open_dir / "home")
    jar = make_jar(tmp_path / "vendor")  # under pytest's 0700 directories, like a checkout under /root
    user, problem = reach_crawl_user(USER, stack, jar)
    assert problem is None
    assert user.grid_jar == stack.dir / "grid" / jar.name
    assert user.grid_jar.read_bytes() == jar.read_bytes() and user.grid_jar.stat().st_mode & 0o777 == 0o644
    again, _ = reach_crawl_user(USER, stack, jar)
    assert again == user


@needs_root
def test_a_home_the_user_cannot_reach_or_a_missing_user_is_said_and_nothing_switches(tmp_path, open_dir):
    jar = make_jar(open_dir / "vendor")
    user, problem = reach_crawl_user(USER, LocalStack(tmp_path / "home"), jar)
    assert user is None and f"user {USER} cannot reach {tmp_path / 'home' / 'local' / 'instances'}" in problem
    user, problem = reach_crawl_user("no-such-user-gf", LocalStack(open_dir / "home"), jar)
    assert user is None and "there is no user no-such-user-gf" in problem
    assert reach_crawl_user("root", LocalStack(open_dir / "home"), jar) == (None, "the crawl user root is root")


@needs_root
def test_local_nodes_start_their_grid_node_as_the_crawl_user_said_once(open_dir, caplog):
    jar = make_jar(open_dir / "vendor")
    stack = LocalStack(open_dir / "home", grid_jar=jar)
    env = local_env(stack, USER)
    caplog.clear()  # what the environment said of the config (the node cap) is not the crawl user's business
    with caplog.at_level(logging.INFO, logger="gridfleet"):
        provider = env.provider("r1", clock=None)
        assert not caplog.records  # nothing is decided before a node is launched
        cmds = [provider.node_command("r1", f"i-{n}", stack.instances_dir / "r1" / f"i-{n}") for n in (1, 2)]
    for cmd in cmds:
        assert cmd[cmd.index("--grid-user") + 1] == USER and cmd[cmd.index("--grid-jar") + 1] == str(jar)
        # the Grid secret reaches a node as the path of the stack's 0600 file, never on its command line
        assert cmd[cmd.index("--grid-secret-file") + 1] == str(stack.grid_secret_file)
        assert not any(SECRET.value in a or SECRET.password in a for a in cmd)
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"embedded default: local nodes run their Grid node and Chromium as {USER} (uid 65534)"]


@needs_root
def test_without_the_crawl_user_local_nodes_run_as_root_only_when_fleet_yaml_allows_it_said_once(open_dir, caplog):
    jar = make_jar(open_dir / "vendor")
    stack = LocalStack(open_dir / "home", grid_jar=jar)
    env = local_env(stack, "no-such-gf", browser={"allow_no_sandbox": True})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gridfleet"):
        provider = env.provider("r1", clock=None)
        cmds = [provider.node_command("r1", f"i-{n}", stack.instances_dir / "r1" / f"i-{n}") for n in (1, 2)]
    for cmd in cmds:
        assert "--grid-user" not in cmd and cmd[cmd.index("--grid-jar") + 1] == str(jar)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "embedded default: local nodes run Chromium without its sandbox (allowed): Chromium would run as root, "
        "where it refuses its sandbox (there is no user no-such-gf (fleet.crawl_user; `make setup` run as root "
        "creates it))"
    ]


def test_a_run_whose_nodes_cannot_have_the_sandbox_is_refused_in_one_line_before_anything_starts(
    open_dir, tmp_path, monkeypatch, capsys
):
    """The seam: `node.browser.sandbox_problem`, the one probe of the sandbox, says it is unavailable."""
    monkeypatch.setattr(browser, "sandbox_problem", lambda *a, **k: "the kernel denies it (injected)")
    monkeypatch.setenv("GRIDFLEET_HOME", str(open_dir / "home"))
    monkeypatch.chdir(tmp_path)
    cfg = open_dir / "fleet.yaml"
    cfg.write_text('sites: [{id: a, start_url: "{demo}/s/a/"}]\n')
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = main(["run", "--local", "--config", str(cfg), "--run-id", "sbx"])
    finally:
        root.handlers[:], root.level = handlers, level
    err = capsys.readouterr().err
    assert code == 1, err
    [line] = err.splitlines()
    assert line.startswith("gridfleet: error: Chromium cannot have its sandbox: the kernel denies it (injected)")
    assert line.endswith("; set browser.allow_no_sandbox: true in fleet.yaml to crawl without it on this machine")
    assert not (open_dir / "home" / "local" / "stack.json").exists() and not (tmp_path / "runs").exists()


@needs_root
def test_a_umask_that_closes_the_nodes_state_dirs_is_said(open_dir):
    old = os.umask(0o077)
    try:
        user, problem = reach_crawl_user(USER, LocalStack(open_dir / "home"), make_jar(open_dir / "vendor"))
    finally:
        os.umask(old)
    assert user is None and problem == f"the umask 0077 makes the nodes' state dirs closed to user {USER}"
