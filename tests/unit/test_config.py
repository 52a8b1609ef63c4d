"""fleet.yaml validation: every error names the file, the line and the field."""

from __future__ import annotations

import logging
import textwrap

import pytest
from pydantic import ValidationError

from fleet.config.load import dump_config, load_config, parse_config
from fleet.errors import ConfigError

GOOD = """\
run: {max_attempts: 3, hang_after_s: 120}
fleet: {max_nodes: 20, instance_types: [t3.medium, t3a.medium]}
aws: {region: ap-northeast-2, table: TrendlyzeStatus, queue: trendlyze-sites, bucket: trendlyze-results}
sites:
  - {id: zdnet, start_url: "https://zdnet.co.kr/", crawler: links,
     options: {item: "a.item", next: "a.next", max_pages: 5}}
  - {id: demo-1, start_url: "{demo}/s/demo-1/?pages=2"}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(textwrap.dedent(text), "fleet.yaml")
    return [str(p) for p in e.value.problems]


def test_a_full_example_is_valid_and_round_trips():
    c = parse_config(GOOD, "fleet.yaml")
    assert c.run.hang_after_s == 120 and c.fleet.instance_types == ("t3.medium", "t3a.medium")
    assert c.site("zdnet").options["max_pages"] == 5 and c.site("demo-1").uses_demo
    assert parse_config(dump_config(c)) == c
    with pytest.raises(ValidationError, match="frozen"):
        c.run.max_attempts = 5


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "run: {max_attempts: 0}\nsites: [{id: a, start_url: 'http://a.test'}]",
            "fleet.yaml:1: run.max_attempts: Input should be greater than or equal to 1",
        ),
        (
            "run:\n  hang_after_s: 0\nsites: [{id: a, start_url: 'http://a.test'}]",
            "fleet.yaml:2: run.hang_after_s: Input should be greater than 0",
        ),
        (
            "run:\n  colour: red\nsites: [{id: a, start_url: 'http://a.test'}]",
            "fleet.yaml:2: run.colour: unknown key 'colour'",
        ),
        (
            "sites:\n  - {id: a, start_url: 'http://a.test'}\n  - {id: a, start_url: 'http://b.test'}",
            "fleet.yaml:3: sites[1].id: duplicate site id 'a' (first at sites[0])",
        ),
        ("sites:\n  - {id: a}", "fleet.yaml:2: sites[0].start_url: required key is missing"),
        ("sites:\n  - {id: a, start_url: 'ftp://a'}", "fleet.yaml:2: sites[0].start_url: must be an http(s) URL"),
        ("sites:\n  - {id: a, start_url: 'http://'}", "fleet.yaml:2: sites[0].start_url: must be an http(s) URL"),
        ("sites: []", "fleet.yaml:1: sites: at least one site is required"),
        ("run: {}", "fleet.yaml:1: sites: required key is missing"),
        (
            "sites:\n  - {id: a, start_url: 'http://a.test', crawler: nope}",
            "fleet.yaml:2: sites[0].crawler: unknown crawler 'nope'",
        ),
        (
            "sites:\n  - {id: a, start_url: 'http://a.test', crawler: 'no.such.module:Crawler'}",
            "fleet.yaml:2: sites[0].crawler: unknown crawler 'no.such.module:Crawler': module 'no.such.module' cannot",
        ),
        ("sites:\n  - {id: '../x', start_url: 'http://a.test'}", "fleet.yaml:2: sites[0].id: '../x' is not a site id"),
        ("sites: [\n", "fleet.yaml:2: malformed YAML"),
        ("run: {a: 1}\nrun: {b: 2}\nsites: []", "fleet.yaml:2: run: duplicate key"),
        ("- 1\n- 2", "fleet.yaml:1: the top level must be a mapping"),
        ("", "fleet.yaml: the file is empty"),
        (
            "fleet: {sites_per_node: -1}\nsites: [{id: a, start_url: 'http://a.test'}]",
            "fleet.yaml:1: fleet.sites_per_node: Input should be greater than or equal to 0",
        ),
        (
            "aws: {endpoint_url: 'localhost:4566'}\nsites: [{id: a, start_url: 'http://a.test'}]",
            "fleet.yaml:1: aws.endpoint_url: must be an http(s) URL",
        ),
        (
            "aws: {node_ami: 'ami-0; reboot'}\nsites: [{id: a, start_url: 'http://a.test'}]",
            "fleet.yaml:1: aws.node_ami: String should match pattern",
        ),
        ("aws: {ami: debian-12}\nsites: [{id: a, start_url: 'http://a.test'}]", "fleet.yaml:1: aws.ami: String should"),
    ],
)
def test_bad_input_is_named_by_file_line_and_field(text, expected):
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


def test_unknown_key_lists_the_allowed_ones():
    (p,) = problems("fleet: {max_node: 3}\nsites: [{id: a, start_url: 'http://a.test'}]")
    assert "allowed: max_nodes" in p


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "nope.yaml")
    assert "nope.yaml: no such file" in str(e.value)


def test_demo_placeholder_resolution():
    c = parse_config(GOOD)
    assert c.site("demo-1").url_for("http://127.0.0.1:8800") == "http://127.0.0.1:8800/s/demo-1/?pages=2"
    assert c.site("zdnet").url_for(None) == "https://zdnet.co.kr/"
    with pytest.raises(ValueError):
        c.site("demo-1").url_for(None)


def test_examples_are_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples"
    for path in sorted(root.glob("*.yaml")):
        load_config(path)
    demo = load_config(root / "demo.yaml")
    assert len(demo.sites) == 87


def test_built_in_crawlers_options_are_checked_at_load_and_dotted_paths_keep_free_options():
    found = problems("""\
        sites:
          - {id: a, start_url: 'http://a.test', options: {max_pages: 0, itme: a.x}}
          - {id: b, start_url: 'http://b.test', crawler: api, options: {max_pages: '5', next: ''}}
          - {id: c, start_url: 'http://c.test', crawler: 'tests.helpers.crawlers:QuickCrawler', options: {any: [1]}}
        """)
    assert sorted(found) == sorted(
        [
            "fleet.yaml:2: sites[0].options.itme: unknown key 'itme' "
            "(allowed: item, next, max_pages, fields, detail, id)",
            "fleet.yaml:2: sites[0].options.max_pages: Input should be greater than or equal to 1",
            "fleet.yaml:3: sites[1].options.next: must not be empty",
            "fleet.yaml:3: sites[1].options.max_pages: Input should be a valid integer",
        ]
    ), found


def test_a_dump_quotes_the_keys_the_loader_would_read_as_booleans():
    text = """sites: [{id: n, start_url: 'http://a.test', crawler: 'tests.helpers.crawlers:QuickCrawler',
                       options: {'y': 1, 'on': 2, 'N': [y, n, 'no']}}]"""
    config = parse_config(text)
    assert config.site("n").options == {"y": 1, "on": 2, "N": ["y", "n", "no"]}
    assert parse_config(dump_config(config)) == config  # what the nodes read back


ONE_SITE = "sites: [{id: a, start_url: 'http://a.test'}]\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "fleet:\n  instance_types: [t3.medium, t4g.medium, t3a.medium]\n" + ONE_SITE,
            "fleet.yaml:2: fleet.instance_types: instance types of two architectures, arm64 (t4g.medium) and x86_64 "
            "(t3.medium, t3a.medium): the nodes install one bundle, built for one",
        ),
        (
            "fleet: {instance_types: [t3.medium, t3]}\n" + ONE_SITE,
            "fleet.yaml:1: fleet.instance_types: 't3' is not an EC2 instance type (family.size, e.g. t3.medium)",
        ),
        (
            "fleet: {instance_types: [t4g.medium, m7g.large]}\n"
            "aws:\n  ami: /aws/service/debian/release/12/latest/amd64\n" + ONE_SITE,
            "fleet.yaml:2: aws: ami /aws/service/debian/release/12/latest/amd64 is an x86_64 image; "
            "fleet.instance_types are arm64 (Graviton): use /aws/service/debian/release/12/latest/arm64",
        ),
        (
            "aws: {ami: /aws/service/debian/release/12/latest/amd64, node_ami: /images/node/aarch64}\n" + ONE_SITE,
            "fleet.yaml:1: aws: node_ami /images/node/aarch64 is an arm64 image; fleet.instance_types are x86_64: "
            "use /images/node/x86_64",
        ),
        ("aws: {image_python: '3.10'}\n" + ONE_SITE, "fleet.yaml:1: aws.image_python: String should match pattern"),
        ("aws: {image_python: '3.11.4'}\n" + ONE_SITE, "fleet.yaml:1: aws.image_python: String should match pattern"),
    ],
)
def test_the_nodes_platform_is_one_architecture_that_their_images_share(text, expected):
    (found,) = problems(text)
    assert found.startswith(expected), found


def test_images_of_the_instance_types_architecture_or_of_no_named_architecture_pass():
    graviton = parse_config(
        "fleet: {instance_types: [t4g.medium, c7g.large]}\naws: {ami: /aws/service/debian/release/12/latest/arm64,"
        " node_ami: /gridfleet/node-ami, image_python: '3.12'}\n" + ONE_SITE
    )
    assert graviton.aws.image_python == "3.12" and parse_config(dump_config(graviton)) == graviton
    assert parse_config("aws: {ami: ami-0123456789abcdef0}\n" + ONE_SITE).aws.image_python == "3.11"


@pytest.mark.parametrize(
    "text, said",
    [
        ("fleet: {instance_types: [t4g.medium, t3.medium]}\n", "fleet.instance_types: instance types of two"),
        (
            "fleet: {instance_types: [t4g.medium]}\naws: {ami: /aws/service/debian/release/12/latest/amd64}\n",
            "aws: ami /aws/service/debian/release/12/latest/amd64 is an x86_64 image; fleet.instance_types are arm64",
        ),
    ],
)
def test_gridfleet_validate_refuses_them_in_one_line_with_exit_2(tmp_path, capsys, text, said):
    from cli.main import main

    path = tmp_path / "fleet.yaml"
    path.write_text(text + ONE_SITE)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = main(["validate", "--config", str(path)])
    finally:
        root.handlers[:], root.level = handlers, level
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert code == 2 and out == "" and line.startswith(f"gridfleet: error: {path}:") and said in line, err


def test_extra_args_keep_chromium_switches_that_open_nothing_and_the_sandbox_is_on_by_default():
    config = parse_config(
        "browser: {extra_args: [--lang=ko, --disable-gpu-sandbox, --remote-debugging-pipe]}\n" + GOOD, "fleet.yaml"
    )
    assert config.browser.extra_args == ("--lang=ko", "--disable-gpu-sandbox", "--remote-debugging-pipe")
    assert config.browser.allow_no_sandbox is False
    allowed = parse_config("browser: {allow_no_sandbox: true}\n" + GOOD, "fleet.yaml")
    assert allowed.browser.allow_no_sandbox is True
    assert parse_config(dump_config(allowed), "fleet.yaml") == allowed  # the nodes read it back as the hub wrote it


# --- aws.run_config_key: one placeholder, replaced as text ---------------------------------------------------------
def test_the_run_config_key_replaces_run_id_as_text():
    from cli.envs.aws import connect, node_params
    from fleet.config.aws import AwsConfig

    assert AwsConfig().run_config_key == "runs/{run_id}/fleet.yaml"  # the default and its placeholder, unchanged
    assert AwsConfig().run_config_key_for("2026-11-21") == "runs/2026-11-21/fleet.yaml"
    twice = AwsConfig(run_config_key="runs/{run_id}/x/{run_id}.yaml")
    assert twice.run_config_key_for("r1.b_c-d") == "runs/r1.b_c-d/x/r1.b_c-d.yaml"
    with pytest.raises(ValueError, match="is not a run id"):
        twice.run_config_key_for("../x")
    config = parse_config(
        "aws: {efs_id: fs-0123456789abcdef0, run_config_key: 'cfg/{run_id}/{run_id}.yaml'}\n"
        "sites: [{id: a, start_url: 'http://a.test'}]\n"
    )
    assert node_params(config, "r1", "10.0.0.5").config_key == "cfg/r1/r1.yaml"
    assert connect(config).run_config_key("r1") == "cfg/r1/r1.yaml"


@pytest.mark.parametrize(
    "key, said",
    [
        ("runs/{0}/fleet.yaml", "placeholder '{0}' is not {run_id}"),
        ("runs/{}/fleet.yaml", "placeholder '{}' is not {run_id}"),
        ("runs/{run_id!r}/fleet.yaml", "placeholder '{run_id!r}' is not {run_id}"),
        ("runs/{run_id:>9}/fleet.yaml", "placeholder '{run_id:>9}' is not {run_id}"),
        ("runs/{run_id.x}/fleet.yaml", "placeholder '{run_id.x}' is not {run_id}"),
        ("runs/{{run_id}}/fleet.yaml", "placeholder '{}' is not {run_id}"),
        ("runs/{run_id}}/fleet.yaml", "has a '}' outside {run_id}"),
        ("runs/{run_id/fleet.yaml", "has a '{' outside {run_id}"),
        ("runs/fleet.yaml", "has no {run_id}"),
    ],
)
def test_a_run_config_key_with_another_placeholder_is_refused_at_load(key, said):
    with pytest.raises(ConfigError) as e:
        parse_config(f"aws: {{run_config_key: '{key}'}}\nsites: [{{id: a, start_url: 'http://a.test'}}]\n", "f.yaml")
    assert str(e.value).startswith("f.yaml:1: aws.run_config_key: ") and said in str(e.value)
    assert "\n" not in str(e.value)
