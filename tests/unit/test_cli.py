"""The CLI's contract for bad input: one clear message, exit code 2 (or 1), no traceback, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli_env import without_aws_credentials


def gridfleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRIDFLEET_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def bad_config(tmp_path):
    p = tmp_path / "fleet.yaml"
    p.write_text("run:\n  max_attempts: 0\nsites:\n  - {id: a, start_url: 'http://a.test'}\n")
    return p


def test_validate_ok(tmp_path):
    (tmp_path / "ok.yaml").write_text("sites:\n  - {id: a, start_url: 'http://a.test'}\n")
    p = gridfleet(tmp_path, "validate", "--config", "ok.yaml")
    assert p.returncode == 0 and "OK: 1 sites" in p.stdout


@pytest.mark.parametrize("command", [["validate"], ["run", "--local"], ["run", "--local", "--dry-run"]])
def test_invalid_config_exits_2_with_one_message_and_starts_nothing(tmp_path, bad_config, command):
    p = gridfleet(tmp_path, *command, "--config", str(bad_config))
    assert p.returncode == 2
    assert (
        p.stderr.strip() == f"gridfleet: error: {bad_config}:2: run.max_attempts: "
        "Input should be greater than or equal to 1"
    )
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "home").exists()  # no stack, no instance, nothing


BAD_SELECTORS = """\
sites:
  - id: a
    start_url: http://a.test
    options:
      item: div.columns li[
  - id: b
    start_url: http://b.test
    options: {item: 'li:nth-child(2n+1) > a', next: 'a[href$=".html"]', fields: {t: 'h2 + p'}}
  - id: c
    start_url: http://c.test
    crawler: links
    options:
      next: ':scope > a:not(.x)'
      fields:
        when: time@datetime
        name: a@@href
  - id: d
    start_url: http://d.test
    options:
      detail:
        fields:
          body: "a:nth-child("
"""


@pytest.mark.parametrize("command", [["validate"], ["run", "--local"], ["run", "--local", "--dry-run"]])
def test_every_bad_css_selector_is_one_line_naming_file_line_and_key(tmp_path, command):
    """Each selector of the `links` crawler is parsed when the config loads: all the bad ones are said together,
    before any page (or anything else) is started."""
    (tmp_path / "fleet.yaml").write_text(BAD_SELECTORS)
    p = gridfleet(tmp_path, *command, "--config", "fleet.yaml")
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    lines = p.stderr.removeprefix("gridfleet: error: ").splitlines()
    assert lines == [
        "fleet.yaml:5: sites[0].options.item: not a CSS selector: 'div.columns li[': "
        "malformed attribute selector at character 15",
        "fleet.yaml:16: sites[2].options.fields.name: not a CSS selector: 'a@' (before @href): "
        "invalid character '@' at character 2",
        "fleet.yaml:22: sites[3].options.detail.fields.body: not a CSS selector: 'a:nth-child(': "
        "invalid syntax for pseudo class ':nth-child' at character 2",
    ], p.stderr
    assert not (tmp_path / "home").exists()  # no stack, no instance, nothing


def test_missing_config_file(tmp_path):
    p = gridfleet(tmp_path, "run", "--local")
    assert p.returncode == 2 and "fleet.yaml: no such file" in p.stderr


def test_bad_run_id_is_a_usage_error(tmp_path):
    p = gridfleet(tmp_path, "run", "--local", "--run-id", "../x")
    assert p.returncode == 2 and "--run-id" in p.stderr and "Traceback" not in p.stderr


def test_an_aws_run_without_credentials_exits_1_naming_them_and_starts_nothing(tmp_path):
    (tmp_path / "fleet.yaml").write_text(
        "aws: {imds_url: 'http://127.0.0.1:9'}\nsites:\n  - {id: a, start_url: 'http://a.test'}\n"
    )
    env = without_aws_credentials(tmp_path)
    p = subprocess.run(
        [sys.executable, "-m", "cli.main", "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 1 and "no AWS credentials" in p.stderr and "Traceback" not in p.stderr


def test_the_aws_dry_run_needs_no_credentials_and_calls_nothing(tmp_path):
    """The first AWS command a new user tries, before any credentials exist: the plan, and exit 0."""
    example = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
    env = without_aws_credentials(tmp_path)
    out = []
    for args in (
        ["run", "--config", str(example), "--dry-run", "--run-id", "d1"],
        ["render", "node", "--config", str(example), "--run-id", "d1", "--hub-address", "10.0.0.10"],
    ):
        p = subprocess.run(
            [sys.executable, "-m", "cli.main", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 0 and p.stderr == "", p.stderr
        out.append(p.stdout)
    dry = out[0]
    assert (
        "AMI:        /aws/service/debian/release/12/latest/amd64 (SSM parameter) -> not resolved: no AWS "
        "credentials" in dry
    )
    for line in (
        "profile:    gridfleet-node: not resolved",
        "table:      DynamoDB TrendlyzeStatus: not resolved",
        "queue:      SQS trendlyze-sites (DLQ trendlyze-sites-dlq): not resolved",
        "bucket:     S3 trendlyze-results: not resolved",
        "bytes of cloud-config (limit 16384)",
        "up to 1 x t3.medium/t3a.medium (spot, on-demand fallback)",
    ):
        assert line in dry, dry


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    (tmp_path / "fleet.yaml").write_text("sites:\n  - {id: a, start_url: '{demo}/s/a/'}\n")
    p = gridfleet(tmp_path, "run", "--local", "--dry-run", "--run-id", "d1")
    assert p.returncode == 0 and "dry run" in p.stdout and "{demo}/s/a/" in p.stdout
    assert not (tmp_path / "home").exists()


def test_status_with_nothing_to_show_says_so(tmp_path):
    p = gridfleet(tmp_path, "status")
    assert p.returncode == 1 and "no run to show" in p.stderr and "Traceback" not in p.stderr


def test_status_reads_an_exported_summary(tmp_path):
    import json

    run = tmp_path / "runs" / "2026-11-21"
    run.mkdir(parents=True)
    site = {
        "run_status": "FAILED",
        "site_status": "FAILED",
        "attemptCount": 3,
        "failure_reason": "hang",
        "result_key": None,
        "attempts": [],
    }
    (run / "summary.json").write_text(
        json.dumps({"run_id": "2026-11-21", "started_at": 0, "finished_at": 1, "sites": {"a": site}, "nodes": {}})
    )
    p = gridfleet(tmp_path, "status", "--json")
    assert p.returncode == 0
    data = json.loads(p.stdout)
    assert data["run_id"] == "2026-11-21" and data["counts"]["FAILED"] == 1 and data["sites"]["a"] == site
    table = gridfleet(tmp_path, "status", "--run-id", "2026-11-21")
    assert table.returncode == 0 and "hang" in table.stdout


def test_help_explains_the_commands(tmp_path):
    p = gridfleet(tmp_path, "--help")
    assert p.returncode == 0
    for word in ("validate", "run", "status", "teardown", "local", "node", "Exit codes"):
        assert word in p.stdout
    assert "--resume" in gridfleet(tmp_path, "run", "--help").stdout


def test_node_help_is_the_agents(tmp_path):
    p = gridfleet(tmp_path, "node", "--help")
    assert p.returncode == 0 and "node agent" in p.stdout


AWS_CONFIG = """\
aws: {efs_id: fs-0123456789abcdef0, bucket: trendlyze-results, hub_address: 10.0.1.10}
sites:
  - {id: a, start_url: 'http://a.test'}
"""


def test_render_prints_valid_user_data_for_hub_and_node(tmp_path):
    import yaml

    (tmp_path / "fleet.yaml").write_text(AWS_CONFIG)
    node = gridfleet(tmp_path, "render", "node", "--run-id", "2026-11-21")
    assert node.returncode == 0 and node.stdout.startswith("#cloud-config")
    assert "fs-0123456789abcdef0" in node.stdout and yaml.safe_load(node.stdout)["write_files"]
    hub = gridfleet(tmp_path, "render", "hub")
    assert hub.returncode == 0 and "gridfleet-hub.service" in hub.stdout


def test_render_refuses_what_cannot_be_user_data(tmp_path):
    (tmp_path / "fleet.yaml").write_text(AWS_CONFIG.replace("fs-0123456789abcdef0", "fs-nothex!"))
    p = gridfleet(tmp_path, "render", "node")
    assert p.returncode == 2 and "efs_id" in p.stderr and "Traceback" not in p.stderr
    (tmp_path / "fleet.yaml").write_text(AWS_CONFIG.replace(", hub_address: 10.0.1.10", ""))
    p = gridfleet(tmp_path, "render", "node")
    assert p.returncode == 2 and "--hub-address" in p.stderr


TF_OUTPUT = {
    "gridfleet_aws": {
        "sensitive": False,
        "type": "object",
        "value": {
            "region": "ap-northeast-2",
            "table": "TrendlyzeStatus",
            "queue": "trendlyze-sites",
            "dlq": "trendlyze-sites-dlq",
            "bucket": "trendlyze-results",
            "efs_id": "fs-0123456789abcdef0",
            "subnet_ids": ["subnet-1", "subnet-2"],
            "security_group_ids": ["sg-1"],
            "instance_profile": "gridfleet-node",
            "ami": "/aws/service/debian/release/12/latest/amd64",
            "key_name": None,
            "node_launch_template": "gridfleet-node",
        },
    },
    "nat_public_ip": {"sensitive": False, "type": "string", "value": "203.0.113.7"},
}


def test_config_from_terraform_prints_an_aws_section_that_validates(tmp_path):
    import json

    import yaml

    from fleet.config.load import parse_config

    (tmp_path / "out.json").write_text(json.dumps(TF_OUTPUT))
    p = gridfleet(tmp_path, "config", "from-terraform", "--tf-output", "out.json")
    assert p.returncode == 0, p.stderr
    section = yaml.safe_load(p.stdout)
    assert section["aws"]["efs_id"] == "fs-0123456789abcdef0" and section["aws"]["subnet_ids"] == [
        "subnet-1",
        "subnet-2",
    ]
    config = parse_config(p.stdout + "sites: [{id: a, start_url: 'https://a.test/'}]\n")
    assert config.aws.node_launch_template == "gridfleet-node" and config.aws.dlq_name == "trendlyze-sites-dlq"
    piped = subprocess.run(
        [sys.executable, "-m", "cli.main", "config", "from-terraform"],
        input=json.dumps(TF_OUTPUT),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert piped.returncode == 0 and piped.stdout == p.stdout


def test_config_from_terraform_names_what_is_wrong(tmp_path):
    import json

    (tmp_path / "other.json").write_text(json.dumps({"nat_public_ip": TF_OUTPUT["nat_public_ip"]}))
    p = gridfleet(tmp_path, "config", "from-terraform", "--tf-output", "other.json")
    assert p.returncode == 2 and "no output 'gridfleet_aws'" in p.stderr
    bad = json.loads(json.dumps(TF_OUTPUT))
    bad["gridfleet_aws"]["value"]["colour"] = "red"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    p = gridfleet(tmp_path, "config", "from-terraform", "--tf-output", "bad.json")
    assert p.returncode == 2 and "gridfleet_aws.colour" in p.stderr and "Traceback" not in p.stderr


BAD_INPUT = {
    "malformed YAML": ("sites: [\n", "fleet.yaml:2: malformed YAML"),
    "unknown key": (
        "fleet: {max_node: 2}\nsites: [{id: a, start_url: 'http://a.test'}]\n",
        "fleet.yaml:1: fleet.max_node: unknown key 'max_node'",
    ),
    "duplicate site ids": (
        "sites:\n  - {id: a, start_url: 'http://a.test'}\n  - {id: a, start_url: 'http://b.test'}\n",
        "fleet.yaml:3: sites[1].id: duplicate site id 'a'",
    ),
    "missing URL": ("sites:\n  - {id: a}\n", "fleet.yaml:2: sites[0].start_url: required key is missing"),
    "malformed URL": ("sites:\n  - {id: a, start_url: 'not a url'}\n", "fleet.yaml:2: sites[0].start_url: must be"),
    "zero sites": ("sites: []\n", "fleet.yaml:1: sites: at least one site is required"),
    "hang_after_s <= 0": (
        "run: {hang_after_s: 0}\nsites: [{id: a, start_url: 'http://a.test'}]\n",
        "fleet.yaml:1: run.hang_after_s: Input should be greater than 0",
    ),
    "max_attempts < 1": (
        "run: {max_attempts: 0}\nsites: [{id: a, start_url: 'http://a.test'}]\n",
        "fleet.yaml:1: run.max_attempts: Input should be greater than or equal to 1",
    ),
    "max_nodes < 1": (
        "fleet: {max_nodes: 0}\nsites: [{id: a, start_url: 'http://a.test'}]\n",
        "fleet.yaml:1: fleet.max_nodes: Input should be greater than or equal to 1",
    ),
    "unknown crawler": (
        "sites:\n  - {id: a, start_url: 'http://a.test', crawler: shop}\n",
        "fleet.yaml:2: sites[0].crawler: unknown crawler 'shop'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_each_kind_of_bad_input_stops_the_run_before_anything_starts(tmp_path, case):
    text, expected = BAD_INPUT[case]
    (tmp_path / "fleet.yaml").write_text(text)
    p = gridfleet(tmp_path, "run", "--local", "--config", "fleet.yaml")
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"gridfleet: error: {expected}"), p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert not (tmp_path / "home").exists()  # no stack, no node, nothing


def _finished_export(tmp_path: Path, run_id: str, failed: int) -> None:
    import json

    (tmp_path / "fleet.yaml").write_text("sites:\n  - {id: a, start_url: '{demo}/s/a/'}\n")
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    status = "FAILED" if failed else "COMPLETED"
    sites = {
        "a": {
            "run_status": status,
            "site_status": status,
            "attemptCount": 1,
            "attempts": [],
            "failure_reason": "error: x" if failed else None,
            "result_key": None,
            "error": None,
            "instance_id": "n1",
            "lastUpdateEpoch": 2.0,
        }
    }
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "run_id": run_id,
                "started_at": 1.0,
                "finished_at": 2.0,
                "sites": sites,
                "counts": {"COMPLETED": 1 - failed, "FAILED": failed},
            }
        )
    )


@pytest.mark.parametrize("failed, code", [(0, 0), (1, 3)])
def test_resuming_a_finished_local_run_reports_it_and_starts_nothing(tmp_path, failed, code):
    # moto's state went with the stack that ran it: only runs/<id>/summary.json is left, and it is enough.
    _finished_export(tmp_path, "r1", failed)
    p = gridfleet(tmp_path, "run", "--local", "--resume", "--run-id", "r1")
    assert p.returncode == code, p.stderr
    assert "had already finished" in p.stdout and "runs/r1/summary.json" in p.stdout
    assert not (tmp_path / "home" / "local").exists()  # no stack was started


def test_a_new_run_with_the_id_of_a_finished_local_run_is_refused(tmp_path):
    _finished_export(tmp_path, "r1", 0)
    before = (tmp_path / "runs" / "r1" / "summary.json").read_bytes()
    p = gridfleet(tmp_path, "run", "--local", "--run-id", "r1")
    assert p.returncode == 2 and "run r1 already finished" in p.stderr and "--run-id" in p.stderr
    assert "Traceback" not in p.stderr
    assert (tmp_path / "runs" / "r1" / "summary.json").read_bytes() == before
    assert not (tmp_path / "home" / "local").exists()


OPERATOR_BAD_INPUT = {
    "rerun with neither sites nor --failed": (["rerun"], 2, "name the sites to rerun, or pass --failed"),
    "rerun with both": (["rerun", "a", "--failed"], 2, "name the sites to rerun, or pass --failed"),
    "rerun with no local stack": (["rerun", "--failed", "--run-id", "r1"], 2, "no local stack with a run is up"),
    "watch at a zero interval": (["watch", "--interval", "0"], 2, "argument --interval: '0': a number of seconds"),
    "watch with nothing to follow": (["watch", "--out", "elsewhere"], 1, "no run to show"),
    "status of a broken summary": (["status", "--run-id", "broken"], 2, "runs/broken/summary.json: not a run summary"),
    "report with no summary": (["report", "--run-id", "r1"], 1, "no runs/r1/summary.json"),
    "report of a broken summary": (["report", "--run-id", "broken"], 2, "runs/broken/summary.json: not a run summary"),
}


@pytest.mark.parametrize("case", sorted(OPERATOR_BAD_INPUT))
def test_operator_commands_refuse_bad_input_with_one_message(tmp_path, case):
    args, code, expected = OPERATOR_BAD_INPUT[case]
    (tmp_path / "runs" / "broken").mkdir(parents=True)
    (tmp_path / "runs" / "broken" / "summary.json").write_text("[1, 2]")
    p = gridfleet(tmp_path, *args)
    assert p.returncode == code, p.stderr
    assert expected in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "home" / "local").exists()  # nothing was started


def test_the_nodes_config_key_is_the_run_config_key_with_the_run_id_put_in(tmp_path):
    (tmp_path / "fleet.yaml").write_text(
        "aws: {efs_id: fs-0123456789abcdef0, hub_address: 10.0.0.5, run_config_key: 'cfg/{run_id}/{run_id}.yaml'}\n"
        "sites:\n  - {id: a, start_url: 'http://a.test'}\n"
    )
    p = gridfleet(tmp_path, "render", "node", "--config", "fleet.yaml", "--run-id", "r1", "--script")
    assert p.returncode == 0, p.stderr
    assert "CONFIG_KEY=cfg/r1/r1.yaml" in p.stdout


def test_a_run_config_key_with_a_positional_placeholder_is_one_line_exit_2(tmp_path):
    (tmp_path / "fleet.yaml").write_text(
        "aws: {efs_id: fs-0123456789abcdef0, hub_address: 10.0.0.5, run_config_key: 'runs/{0}/fleet.yaml'}\n"
        "sites:\n  - {id: a, start_url: 'http://a.test'}\n"
    )
    for command in (["validate"], ["render", "node", "--run-id", "r1"], ["run", "--local", "--dry-run"]):
        p = gridfleet(tmp_path, *command, "--config", "fleet.yaml")
        assert p.returncode == 2 and "Traceback" not in p.stderr, (command, p.stderr)
        assert p.stderr.splitlines() == [
            "gridfleet: error: fleet.yaml:1: aws.run_config_key: placeholder '{0}' is not {run_id}, the only one "
            "it takes (e.g. runs/{run_id}/fleet.yaml)"
        ]


def test_verbose_means_the_same_before_the_command_and_after_it():
    from cli.main import build_parser

    parser = build_parser()
    commands = {
        "run": ["run", "--local"],
        "crawl": ["crawl", "shop"],
        "validate": ["validate", "--config", "f.yaml"],
        "check": ["check"],
        "status": ["status"],
        "local": ["local", "status"],
    }
    for name, argv in commands.items():
        assert parser.parse_args(argv).verbose is False, name
        assert parser.parse_args(["-v", *argv]).verbose is True, name
        assert parser.parse_args([argv[0], "-v", *argv[1:]]).verbose is True, name
        assert parser.parse_args([*argv, "--verbose"]).verbose is True, name
    sub = next(a for a in parser._actions if a.dest == "command")
    assert all("-v" in p._option_string_actions for n, p in sub.choices.items() if n != "node")  # every command


def test_check_of_a_finished_local_run_reads_runs_without_the_stack(tmp_path):
    import json

    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "results").mkdir(parents=True)
    (run_dir / "results" / "a.json").write_text('{"items": []}')
    attempt = {"instance_id": "n1", "start": 1.0, "end": 2.0, "outcome": "completed"}
    site = {
        "run_status": "COMPLETED",
        "site_status": "COMPLETED",
        "attemptCount": 1,
        "attempts": [attempt],
        "failure_reason": None,
        "result_key": "a/20261121/r1/result.json",
    }
    at_end = {"ok": True, "violations": [], "notes": [], "checked": {"sites": 1, "instances": 1}, "false_losses": 0}
    summary = {
        "run_id": "r1",
        "run_date": "20261121",
        "started_at": 0.5,
        "finished_at": 3.0,
        "sites": {"a": site},
        "max_attempts": 3,
        "check": {**at_end, "false_loss_details": []},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))

    for argv in (["check", "--run-id", "r1"], ["check"], ["check", "--local"]):
        p = gridfleet(tmp_path, *argv)
        assert p.returncode == 0, (argv, p.stdout, p.stderr)
        assert "run r1: OK (1 sites, 1 instances; false_losses 0)" in p.stdout, p.stdout
        assert "runs/r1: the stores went with the local stack" in p.stdout
    assert not (tmp_path / "home" / "local").exists()  # nothing was started

    (run_dir / "results" / "a.json").unlink()
    p = gridfleet(tmp_path, "check", "--run-id", "r1")
    assert p.returncode == 1 and "a: COMPLETED but 0 result objects" in p.stdout, p.stdout

    p = gridfleet(tmp_path, "check", "--run-id", "r2")
    assert p.returncode == 1 and "no run to check" in p.stderr and "runs/r2/summary.json" in p.stderr, p.stderr
    (tmp_path / "runs" / "r3").mkdir()
    (tmp_path / "runs" / "r3" / "summary.json").write_text("[1]")
    p = gridfleet(tmp_path, "check", "--run-id", "r3")
    assert p.returncode == 2 and "runs/r3/summary.json: not a run summary" in p.stderr, p.stderr
