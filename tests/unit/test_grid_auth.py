"""The Grid's secret: kept in 0600 files, never shown, and turned into the Grid's config and a client's header."""

from __future__ import annotations

import base64
import stat
import tomllib
from pathlib import Path

import pytest

from fleet.errors import MissingResource
from fleet.grid_auth import (
    GRID_USER,
    GridSecret,
    grid_request,
    hub_toml,
    make_hub_files,
    parameter_value,
    secret_of_run,
)
from node import main as node_main
from node.grid_node import GridNodeSpec, render_toml


def test_a_secret_is_written_for_its_owner_only_and_read_back(tmp_path):
    s = GridSecret.make()
    path = s.write(tmp_path / "grid-secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert GridSecret.read(path) == s
    assert s.value not in repr(s)


def test_a_file_without_a_secret_is_refused_without_showing_what_it_holds(tmp_path):
    bad = tmp_path / "grid-secret"
    bad.write_text("short but private\n")
    with pytest.raises(MissingResource) as e:
        GridSecret.read(bad)
    assert str(bad) in str(e.value) and "private" not in str(e.value)
    with pytest.raises(MissingResource, match="cannot read"):
        GridSecret.read(tmp_path / "none")


def test_the_hub_config_asks_nodes_for_the_registration_secret_and_clients_for_the_password():
    s = GridSecret.make()
    conf = tomllib.loads(hub_toml(s))
    assert conf == {
        "server": {"registration-secret": s.registration_secret},
        "router": {"username": GRID_USER, "password": s.password},
    }
    assert len({s.value, s.registration_secret, s.password}) == 3  # each use its own value


def test_a_grid_node_shows_the_registration_secret_and_only_that():
    s = GridSecret.make()
    spec = GridNodeSpec(jar=Path("x.jar"), grid_url="http://h:4444", publish="tcp://h:1", subscribe="tcp://h:2")
    with_secret = tomllib.loads(render_toml(GridNodeSpec(**{**spec.__dict__, "secret": s}), "i-1", 5555))
    assert with_secret["server"]["registration-secret"] == s.registration_secret
    text = render_toml(GridNodeSpec(**{**spec.__dict__, "secret": s}), "i-1", 5555)
    assert s.password not in text and s.value not in text
    assert "registration-secret" not in tomllib.loads(render_toml(spec, "i-1", 5555))["server"]


def test_a_request_to_the_router_carries_basic_auth_in_a_header_not_the_url():
    s = GridSecret.make()
    req = grid_request("http://127.0.0.1:4444/status", s)
    scheme, token = req.get_header("Authorization").split()
    assert scheme == "Basic" and base64.b64decode(token).decode() == f"{GRID_USER}:{s.password}"
    assert req.full_url == "http://127.0.0.1:4444/status"
    assert grid_request("http://127.0.0.1:4444/status", None).get_header("Authorization") is None


def test_a_node_whose_secret_file_cannot_be_read_stops_before_it_starts(tmp_path, capsys):
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text('sites: [{id: a, start_url: "https://a.test/"}]\n')
    missing = tmp_path / "grid-secret"
    args = ["--config", str(cfg), "--run-id", "r1", "--instance-id", "i-1", "--grid-url", "http://127.0.0.1:9"]
    assert node_main.main([*args, "--local", "--grid-secret-file", str(missing), "--state-dir", str(tmp_path)]) == 2
    assert f"cannot read the Grid secret file {missing}" in capsys.readouterr().err


# --- the AWS hub's secret: one per run ----------------------------------------------------------------------------
def hub_files(tmp_path: Path, run_id: str, current: str | None) -> tuple[bool, GridSecret, Path]:
    value = tmp_path / "grid-secret.value"
    kept = make_hub_files(
        tmp_path / "grid-secret",
        tmp_path / "grid-hub.toml",
        tmp_path / "grid-curl.conf",
        run_id=run_id,
        current=current,
        parameter_file=value,
    )
    return kept, GridSecret.read(tmp_path / "grid-secret"), value


def test_the_parameter_holds_the_run_id_beside_the_secret_and_gives_it_to_that_run_only():
    s = GridSecret.make()
    value = parameter_value("2026-11-20", s)
    assert value == f"2026-11-20 {s.value}"
    assert secret_of_run(value, "2026-11-20") == s and secret_of_run(value + "\n", "2026-11-20") == s
    for other in ("2026-11-21", "2026-11-2", "2026-11-20x", ""):
        assert secret_of_run(value, other) is None, other
    for bad in (s.value, f"2026-11-20 {s.value} x", "2026-11-20 short", "2026-11-20", "", "\n"):
        assert secret_of_run(bad, "2026-11-20") is None, bad


def test_a_hub_of_a_run_whose_secret_is_there_keeps_it_and_has_nothing_to_put(tmp_path):
    s = GridSecret.make()
    (tmp_path / "grid-secret.value").write_text("left by an earlier boot")
    kept, secret, value = hub_files(tmp_path, "r1", parameter_value("r1", s) + "\n")
    assert kept and secret == s and not value.exists()
    assert (tmp_path / "grid-hub.toml").read_text() == hub_toml(s)
    assert all(stat.S_IMODE((tmp_path / f).stat().st_mode) == 0o600 for f in ("grid-secret", "grid-hub.toml"))


@pytest.mark.parametrize("current", [None, "", "r0 " + "x" * 43, "x" * 43])
def test_any_other_hub_makes_a_new_secret_and_the_value_to_put(tmp_path, current):
    kept, secret, value = hub_files(tmp_path, "r1", current)
    assert not kept and value.read_text() == f"r1 {secret.value}"
    assert stat.S_IMODE(value.stat().st_mode) == 0o600
    assert current is None or secret.value not in current
