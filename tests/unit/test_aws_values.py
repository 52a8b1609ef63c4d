"""`gridfleet validate` refuses every value of aws.region, aws.efs_id and aws.hub_address that rendering a node's
user-data refuses: one rule for each (`fleet.config.aws.USER_DATA_RULES`), which `cloud_init.render`, importing
nothing of the project, copies and checks again. Through the real command line for the values written out, and
on the two models for any text."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cli.main import main
from cloud_init import render
from fleet.config.aws import USER_DATA_RULES, AwsConfig

SITE = 'sites: [{id: a, start_url: "http://a.test"}]\n'
VALID = {"region": "ap-northeast-2", "efs_id": "fs-0123456789abcdef0", "hub_address": "10.0.0.5"}
#: What a node's user-data needs besides the value a test varies.
NODE = dict(
    run_id="r1",
    bucket="gridfleet-artifacts",
    bundle_key="bundle/gridfleet-bundle.tar.gz",
    config_key="runs/r1/fleet.yaml",
    grid_secret_parameter="/gridfleet/grid-secret",
    **VALID,
)
#: Values each rule refuses, as an operator's typo or a pasted value makes them.
REFUSED = {
    "region": ["ap-northeast-2\n", " ap-northeast-2", "AP-NORTHEAST-2", "ap-northeast", "", "ap-northeast-2;x"],
    "efs_id": ["fs-0123456789abcdef0\n", "fs-0123", "fs-0123456789ABCDEF0", "fsap-0123456789abcdef0", ""],
    "hub_address": ["10.0.0.5\n", "10.0.0.5 ", "-hub", "hub-", "10.0.0.5:4444", "h/x", "", "a" * 254],
}
COPIES = {"region": render._REGION_RE, "efs_id": render._EFS_ID_RE, "hub_address": render._HOST_RE}


def test_render_checks_each_value_by_a_copy_of_the_configs_own_rule():
    assert {field: pattern.pattern for field, (pattern, _) in USER_DATA_RULES.items()} == {
        field: copy.pattern for field, copy in COPIES.items()
    }


def renders(field: str, value: str) -> bool:
    try:
        render.NodeUserData(**{**NODE, field: value})
    except render.RenderError as e:
        assert e.field == field, e
        return False
    return True


def loads(field: str, value: str) -> bool:
    try:
        AwsConfig(**{field: value})
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("field", list(REFUSED))
def test_the_values_written_out_are_refused_by_both(field):
    assert renders(field, VALID[field]) and loads(field, VALID[field])
    for value in REFUSED[field]:
        assert not renders(field, value), value
        assert not loads(field, value), value


def _near(valid: str) -> st.SearchStrategy[str]:
    """A valid value with something added before or after, or a character changed: what typos make."""
    edge = st.sampled_from(["", "\n", " ", "\t", "-", ".", "A", "0", "/", "\x00", "é"])
    spliced = st.builds(lambda i, c: valid[:i] + c + valid[i + 1 :], st.integers(0, len(valid)), edge)
    return st.builds(lambda pre, post: pre + valid + post, edge, edge) | spliced


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_value_loads_exactly_when_it_renders(data):
    field = data.draw(st.sampled_from(list(USER_DATA_RULES)))
    value = data.draw(st.text(max_size=80) | _near(VALID[field]))
    assert loads(field, value) == renders(field, value), (field, value)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """`gridfleet ARGV` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in REFUSED.items() for v in values])
def test_validate_refuses_what_render_node_refuses_in_one_line_naming_the_field(tmp_path, cli, field, value):
    path = tmp_path / "fleet.yaml"
    yaml_value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    path.write_text("aws: {" + ", ".join(f'{k}: "{v}"' for k, v in {**VALID, field: yaml_value}.items()) + "}\n" + SITE)
    expected = USER_DATA_RULES[field][1]

    for argv in (["validate"], ["render", "node", "--run-id", "r1"]):
        code, out, err = cli(*argv, "--config", str(path))
        assert (code, out) == (2, ""), (argv, err)
        assert err.splitlines() == [
            f"gridfleet: error: {path}:1: aws.{field}: {render._quote(value)} is not {expected}"
        ]
