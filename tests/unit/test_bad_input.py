"""Bad input through the real command line: one line naming the file, the line and the field, exit code 2, no
traceback, nothing started, and bounded time and memory whatever the input holds.

`cli.main.main` runs in this process (so its time and memory can be measured, and what it imported seen) with
stdout and stderr captured; nothing is faked.
"""

from __future__ import annotations

import io
import logging
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.main import main

SITE = 'sites: [{id: a, start_url: "http://a.test"}]\n'

#: Nine levels of nine aliases: a few hundred bytes that expand to 9**9 (387 million) strings.
ALIAS_BOMB = "sites:\n  - id: a\n    start_url: http://a.test\n    crawler: my.crawlers:Shop\n    options:\n" + "".join(
    f"      {name}: &{name} [{', '.join([prev] * 9)}]\n"
    for name, prev in zip("abcdefghi", ['"lol"', "*a", "*b", "*c", "*d", "*e", "*f", "*g", "*h"], strict=True)
)

#: 100 KB of one letter: a value no error line may quote whole.
BIG = "a" * 102_400

#: What `render node` needs of `aws:` besides the value a case breaks.
AWS_NODE = {"efs_id": "fs-0123456789abcdef0", "hub_address": "10.0.0.5"}
AWS_NODE_YAML = ", ".join(f"{k}: {v}" for k, v in AWS_NODE.items())

TF_OUTPUT_NOT_UTF8 = b'{"gridfleet_aws": {"value": {"region": "\xff"}}}'


@dataclass
class Case:
    argv: list[str]  # {F}: the file the case writes
    expected: str  # the one error line holds this, {F} replaced
    content: str | bytes | None = None  # written to F
    stdin: bytes | None = None
    gone: list[str] = field(default_factory=list)  # modules that must not be imported by the command


def validate(content: str | bytes, expected: str) -> Case:
    return Case(["validate", "--config", "{F}"], expected, content)


def dry_run(content: str, expected: str) -> Case:
    return Case(["run", "--local", "--dry-run", "--config", "{F}"], expected, content)


def refused_switch(arg: str, name: str) -> Case:
    """browser.extra_args carrying a switch the code alone decides (the sandbox) or one that opens the browser."""
    return dry_run(
        f"browser:\n  extra_args: [--lang=ko, {arg!r}]\n" + SITE,
        f"{{F}}:2: browser.extra_args[1]: {arg.strip()!r}: --{name} is not allowed in extra_args: ",
    )


def render_node(content: str, expected: str) -> Case:
    return Case(["render", "node", "--config", "{F}", "--run-id", "r1"], expected, content)


CASES: dict[str, Case] = {
    "grid-secret --current larger than an SSM parameter": Case(
        ["grid-secret", "--run-id", "r1", "--current", "{F}"]
        + [
            x
            for name in ("secret-file", "hub-config", "curl-config", "parameter-file")
            for x in (f"--{name}", f"{{F}}.{name}")
        ],
        "--current {F} holds more than an SSM parameter can",
        "r1 " + "x" * 100_000,
    ),
    "user_agent on two lines": validate(
        'politeness: {user_agent: "gridfleet/1\\nX-Evil: 1"}\n' + SITE,
        "{F}:1: politeness.user_agent: must be printable ASCII on one line",
    ),
    "user_agent blank": validate(
        'politeness: {user_agent: "  "}\n' + SITE, "{F}:1: politeness.user_agent: must not be blank"
    ),
    "contact_url not a URL": validate(
        "politeness: {contact_url: mailto:ops@x.test}\n" + SITE,
        "{F}:1: politeness.contact_url: must be an http(s) URL",
    ),
    "site politeness.robots not a boolean": validate(
        'sites: [{id: a, start_url: "http://a.test", politeness: {robots: "no"}}]\n',
        "{F}:1: sites[0].politeness.robots: Input should be a valid boolean",
    ),
    "site politeness unknown key": validate(
        'sites: [{id: a, start_url: "http://a.test", politeness: {robot: false}}]\n',
        "{F}:1: sites[0].politeness.robot: unknown key 'robot' (allowed: robots, per_domain_s)",
    ),
    "extra_args --no-sandbox": refused_switch("--no-sandbox", "no-sandbox"),
    "extra_args --no-sandbox=1, spaced": refused_switch("  --No-Sandbox=1 ", "no-sandbox"),
    "extra_args --remote-debugging-address": refused_switch(
        "--remote-debugging-address=0.0.0.0", "remote-debugging-address"
    ),
    "extra_args --remote-debugging-port": refused_switch("--remote-debugging-port", "remote-debugging-port"),
    "extra_args -Remote-Debugging-Port=9222": refused_switch(" -Remote-Debugging-Port=9222", "remote-debugging-port"),
    "extra_args --remote-allow-origins": refused_switch("--remote-allow-origins=*", "remote-allow-origins"),
    "allow_no_sandbox not a boolean": dry_run(
        "browser: {allow_no_sandbox: 'yes'}\n" + SITE,
        "{F}:1: browser.allow_no_sandbox: Input should be a valid boolean",
    ),
    # a YAML alias bomb under a site's options: refused before anything is expanded
    "alias bomb": validate(
        ALIAS_BOMB, "{F}:12: sites[0].options.g: more than 1,000,000 values once aliases are expanded"
    ),
    "recursive alias": validate(
        "run: &a [*a]\n" + SITE, "{F}:1: run[0]: recursive alias *a: the value contains itself"
    ),
    "recursive merge": validate("run: &r {<<: *r}\n" + SITE, "{F}:1: run.<<: recursive alias *r"),
    "nesting without end": validate("run: " + "[" * 100_000, "{F}:1: nested deeper than 64 levels"),
    "nesting by aliases": validate(
        "x: &x0 [[[[[[[[[[1]]]]]]]]]]\n" + "".join(f"x{i}: &x{i} [[[[[[[[[[*x{i - 1}]]]]]]]]]]\n" for i in range(1, 8)),
        "{F}:7: x6[0][0][0][0][0][0][0][0][0][0]: nested deeper than 64 levels once aliases are expanded",
    ),
    "custom tag": validate("run: !foo {max_attempts: 2}\n" + SITE, "{F}:1: run: tag '!foo' is not supported"),
    "python tag": validate(
        "run: {max_attempts: !!python/object/apply:os.system [true]}\n" + SITE,
        "{F}:1: run.max_attempts: tag '!!python/object/apply:os.system' is not supported",
    ),
    "merge of a scalar": validate(
        "run: {<<: &three 3}\n" + SITE, "{F}:1: run: '<<' (merge) takes a mapping or a list of mappings"
    ),
    "5000-digit integer": validate(
        "run: {max_attempts: " + "1" * 5000 + "}\n" + SITE,
        "{F}:1: run.max_attempts: integer 111111111111111111111111… (5000 characters) is too long (at most 38 digits)",
    ),
    "5000-digit integer in options": validate(
        "sites:\n  - id: a\n    start_url: http://a.test\n    crawler: my.crawlers:Shop\n"
        "    options: {count: 0x" + "f" * 5000 + "}\n",
        "{F}:5: sites[0].options.count: integer 0xffffffffffffffffffffff… (5002 characters) is too long",
    ),
    ".inf duration": validate(
        "run: {hang_after_s: .inf}\n" + SITE, "{F}:1: run.hang_after_s: .inf is not a finite number"
    ),
    "1e309 duration": validate(
        "run:\n  deadline_s: 1e309\n" + SITE, "{F}:2: run.deadline_s: Input should be a finite number"
    ),
    "1.0e+309 price": validate(
        "fleet:\n  hourly_price: {t3.medium: 1.0e+309}\n" + SITE,
        "{F}:2: fleet.hourly_price['t3.medium']: 1.0e+309 is not a finite number",
    ),
    ".nan rate": validate(
        SITE + "rate_limits: {g: {per_s: .nan}}\n", "{F}:2: rate_limits.g.per_s: .nan is not a finite number"
    ),
    "site id ending in a newline": validate(
        'sites:\n  - {id: "a\\n", start_url: "http://a.test"}\n', "{F}:2: sites[0].id: 'a\\n' is not a site id"
    ),
    "group name ending in a newline": validate(
        SITE + 'rate_limits: {"g\\n": {per_s: 1}}\n', "{F}:2: rate_limits: group name 'g\\n' is not valid"
    ),
    "--run-id ending in a newline": Case(
        ["run", "--local", "--dry-run", "--config", "{F}", "--run-id", "day\n"],
        "argument --run-id: 'day\\n' is not a run id",
        SITE,
    ),
    "max_pages -5 on links": validate(
        "sites:\n  - id: a\n    start_url: http://a.test\n    options: {max_pages: -5}\n",
        "{F}:4: sites[0].options.max_pages: Input should be greater than or equal to 1",
    ),
    "unknown option of api": validate(
        "sites:\n  - id: a\n    start_url: http://a.test\n    crawler: api\n    options:\n      item: data\n",
        "{F}:6: sites[0].options.item: unknown key 'item' (allowed: items, next, token_param, id, max_pages, headers)",
    ),
    "header that is not a string": validate(
        "sites:\n  - id: a\n    start_url: http://a.test\n    crawler: api\n    options:\n      headers: {X-N: 5}\n",
        "{F}:6: sites[0].options.headers.X-N: Input should be a valid string",
    ),
    "empty selector": validate(
        "sites:\n  - {id: a, start_url: http://a.test, options: {item: ''}}\n",
        "{F}:2: sites[0].options.item: must not be empty",
    ),
    "selector not CSS": validate(
        "sites:\n  - id: a\n    start_url: http://a.test\n    options:\n      item: 'div.columns li['\n",
        "{F}:5: sites[0].options.item: not a CSS selector: 'div.columns li[': malformed attribute selector at",
    ),
    "field with a bad @attribute part": validate(
        "sites:\n  - id: a\n    start_url: http://a.test\n    options: {fields: {link: 'a@@href'}}\n",
        "{F}:4: sites[0].options.fields.link: not a CSS selector: 'a@' (before @href): invalid character '@'",
    ),
    "100 KB selector not CSS": validate(
        f"sites:\n  - {{id: a, start_url: http://a.test, options: {{item: '{BIG}['}}}}\n",
        f"{{F}}:2: sites[0].options.item: not a CSS selector: '{BIG[:64]}…' (102401 characters): malformed",
    ),
    "key on": validate(
        "run:\n  max_attempts: 2\n  on: 3\n" + SITE,
        """{F}:3: run: key 'on' is read as a boolean (true) by YAML: quote it ("on") if it is meant """
        "as a name",
    ),
    "key no in options": validate(
        "sites:\n  - id: a\n    start_url: http://a.test\n    crawler: my.crawlers:Shop\n    options: {no: 1}\n",
        "{F}:5: sites[0].options: key 'no' is read as a boolean (false) by YAML",
    ),
    "key ~": validate("run: {~: 3}\n" + SITE, "{F}:1: run: key '~' is read as null by YAML: quote it"),
    "key y": validate("run: {y: 3}\n" + SITE, "{F}:1: run: key 'y' is read as a boolean (true) by YAML"),
    "integer key": validate(
        SITE + "fleet: {hourly_price: {7: 0.1}}\n", "{F}:2: fleet.hourly_price: key '7' is read as an integer by YAML"
    ),
    "tf-output not UTF-8": Case(
        ["config", "from-terraform", "--tf-output", "{F}"],
        "gridfleet: error: {F}: not UTF-8 text (byte 0xff at offset 40)",
        TF_OUTPUT_NOT_UTF8,
    ),
    "tf-output on stdin not UTF-8": Case(
        ["config", "from-terraform"], "gridfleet: error: stdin: not UTF-8 text", stdin=TF_OUTPUT_NOT_UTF8
    ),
    "tf-output nested without end": Case(
        ["config", "from-terraform", "--tf-output", "{F}"],
        "{F}: not the JSON of `terraform output -json`",
        "[" * 100_000,
    ),
    "crawler in the standard library": Case(
        ["validate", "--config", "{F}"],
        "{F}:2: sites[0].crawler: unknown crawler 'this.x:Y': 'this' is a module of Python's standard library",
        'sites:\n  - {id: a, start_url: "http://a.test", crawler: "this.x:Y"}\n',
        gone=["this"],
    ),
    "config not UTF-8": validate(SITE.encode() + b'run: {order: "\xff"}\n', "{F}:2: not UTF-8 text"),
    "config larger than 5 MB": validate("# " + "x" * (6 * 2**20) + "\n" + SITE, "{F}: larger than 5 MB"),
    "control character": validate(SITE + "x: \x07\n", "{F}:2: malformed YAML: unacceptable character #x0007"),
    # --- a value ending in a newline, where it becomes user-data: each rule is matched whole
    **{
        f"aws.{field} ending in a newline ({role})": Case(
            ["render", role, "--config", "{F}", "--run-id", "r1"],
            f"{field}: '{value}\\n' is not",
            "aws: {" + ", ".join(f'{k}: "{v}"' for k, v in {**AWS_NODE, field: value + "\\n"}.items()) + "}\n" + SITE,
        )
        for role, field, value in (
            ("node", "region", "ap-northeast-2"),
            ("node", "bucket", "gridfleet-artifacts"),
            ("node", "efs_id", "fs-0123456789abcdef1"),
            ("node", "hub_address", "10.0.0.6"),
            ("hub", "region", "ap-northeast-2"),
            ("hub", "imds_url", "http://169.254.169.254"),
        )
    },
    "--hub-address ending in a newline": Case(
        ["render", "node", "--config", "{F}", "--run-id", "r1", "--hub-address", "10.0.0.7\n"],
        "hub_address: '10.0.0.7\\n' is not a DNS name or an IPv4 address",
        f"aws: {{{AWS_NODE_YAML}}}\n" + SITE,
    ),
    # --- aws.run_config_key: {run_id}, its one placeholder, is checked at load, never given to str.format
    "run_config_key with {0}": validate(
        'aws: {run_config_key: "runs/{0}/fleet.yaml"}\n' + SITE,
        "{F}:1: aws.run_config_key: placeholder '{0}' is not {run_id}, the only one it takes",
    ),
    "run_config_key with {0}, rendering": render_node(
        f'aws: {{{AWS_NODE_YAML}, run_config_key: "runs/{{0}}/fleet.yaml"}}\n' + SITE,
        "{F}:1: aws.run_config_key: placeholder '{0}' is not {run_id}",
    ),
    "run_config_key with {}": validate(
        'aws: {run_config_key: "runs/{}/fleet.yaml"}\n' + SITE, "{F}:1: aws.run_config_key: placeholder '{}'"
    ),
    "run_config_key with {run}": validate(
        'aws: {run_config_key: "runs/{run}/fleet.yaml"}\n' + SITE, "{F}:1: aws.run_config_key: placeholder '{run}'"
    ),
    "run_config_key with a lone {": validate(
        'aws: {run_config_key: "runs/{run_id/fleet.yaml"}\n' + SITE,
        "{F}:1: aws.run_config_key: 'runs/{run_id/fleet.yaml' has a '{' outside {run_id}",
    ),
    "run_config_key without {run_id}": validate(
        'aws: {run_config_key: "runs/fleet.yaml"}\n' + SITE,
        "{F}:1: aws.run_config_key: 'runs/fleet.yaml' has no {run_id}",
    ),
    # --- a value of 100 KB is cut in its error, with its length
    "100 KB site id": validate(
        f'sites:\n  - {{id: "{BIG}", start_url: "http://a.test"}}\n',
        f"{{F}}:2: sites[0].id: '{BIG[:64]}…' (102400 characters) is not a site id",
    ),
    "100 KB start_url": validate(
        f'sites:\n  - {{id: a, start_url: "ftp://{BIG}"}}\n',
        f"{{F}}:2: sites[0].start_url: must be an http(s) URL or start with {{demo}} or {{demo-localhost}}, "
        f"got 'ftp://{BIG[:58]}…' "
        "(102406 characters)",
    ),
    "100 KB crawler": validate(
        f'sites:\n  - {{id: a, start_url: "http://a.test", crawler: "{BIG}"}}\n',
        f"{{F}}:2: sites[0].crawler: unknown crawler '{BIG[:64]}…' (102400 characters)",
    ),
    "100 KB rate_limit group": validate(
        f'sites:\n  - {{id: a, start_url: "http://a.test", rate_limit: "{BIG}"}}\n',
        f"sites[0] (id 'a'): rate_limit '{BIG[:64]}…' (102400 characters) is not a group of rate_limits",
    ),
    "100 KB unknown key": validate(
        f'hub:\n  ? "{BIG}"\n  : 1\n' + SITE,
        f"{{F}}:2: hub['{BIG[:24]}…' (102400 characters)]: unknown key '{BIG[:24]}…' (102400 characters) "
        "(allowed: http, bind, port)",
    ),
    "100 KB --run-id": Case(
        ["run", "--local", "--dry-run", "--config", "{F}", "--run-id", BIG],
        f"argument --run-id: '{BIG[:64]}…' (102400 characters) is not a run id",
        SITE,
    ),
    # --- every id a command takes, 100 KB of it: cut in its one line (ID_ARGUMENTS below holds them to the parser)
    **{
        f"100 KB id: {command} {arg}": Case(argv, f"'{BIG[:64]}…' (102400 characters)", content)
        for (command, arg), (argv, content) in {
            ("crawl", "SITE"): (["crawl", BIG, "--config", "{F}"], SITE),
            ("rerun", "SITE"): (["rerun", "a", BIG], None),
            **{
                (command, "--run-id"): ([command, "--run-id", BIG], None)
                for command in ("rerun", "status", "watch", "report", "check", "teardown", "logs")
            },
            ("render", "--run-id"): (["render", "node", "--config", "{F}", "--run-id", BIG], SITE),
            ("logs", "--node"): (["logs", "--run-id", "r1", "--node", BIG], None),
            ("logs", "--site"): (["logs", "--run-id", "r1", "--site", BIG], None),
            ("ship-logs", "--stream"): (
                ["ship-logs", "{F}", "--config", "{F}", "--group", "/g", "--stream", BIG, "--state", "{F}.d", "--once"],
                SITE,
            ),
            ("grid-secret", "--run-id"): (
                ["grid-secret", "--run-id", BIG]
                + [
                    x
                    for name in ("secret-file", "hub-config", "curl-config", "parameter-file")
                    for x in (f"--{name}", f"{{F}}.{name}")
                ],
                None,
            ),
        }.items()
    },
}

#: The arguments of `gridfleet` that take an id, by command: the cases above give each 100 KB of one.
ID_ARGUMENTS = {name.removeprefix("100 KB id: ") for name in CASES if name.startswith("100 KB id: ")} | {
    "run --run-id"  # the case "100 KB --run-id"
}


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run `gridfleet ARGV` in this process: (exit code, stdout, stderr, CPU seconds, peak bytes allocated). The
    work is measured in this thread's CPU time, which a busy machine does not stretch as it does wall time."""
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(argv: list[str], stdin: bytes | None = None) -> tuple[int, str, str, float, int]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        tracemalloc.start()
        start = time.thread_time()
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own errors
            code = e.code if isinstance(e.code, int) else 1
        finally:
            elapsed = time.thread_time() - start
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        return code, out, err, elapsed, peak

    return run


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_no_traceback_and_bounded(tmp_path, cli, name):
    case = CASES[name]
    path = tmp_path / "input.yaml"
    if isinstance(case.content, str):
        path.write_text(case.content)
    elif case.content is not None:
        path.write_bytes(case.content)
    imported_before = {m for m in case.gone if m in sys.modules}

    code, out, err, seconds, peak = cli([a.replace("{F}", str(path)) for a in case.argv], case.stdin)

    expected = case.expected.replace("{F}", str(path))
    lines = err.splitlines()
    said = lines[next((i for i, line in enumerate(lines) if "error:" in line), 0) :]  # after argparse's usage
    assert code == 2, (code, err)
    assert len(said) == 1 and expected in said[0], err
    assert len(said[0]) <= 300, f"{name}: an error line of {len(said[0])} characters"
    assert "Traceback" not in err + out and out == ""
    assert seconds < 5, f"{name}: {seconds:.1f} s"
    assert peak < 64 * 2**20, f"{name}: {peak / 2**20:.0f} MB"
    assert not (tmp_path / "home").exists()  # nothing started
    assert {m for m in case.gone if m in sys.modules} == imported_before, "the command imported a crawler's module"


def test_a_webhook_url_with_credentials_is_refused_without_echoing_them(tmp_path, cli):
    path = tmp_path / "fleet.yaml"
    path.write_text(SITE + "notify: {webhook_url: 'https://bot:hunter2@hooks.example/services/s3cr3t?token=t0k'}\n")
    code, out, err, _, _ = cli(["validate", "--config", str(path)])
    assert code == 2 and out == "" and "Traceback" not in err
    (line,) = err.splitlines()
    assert f"{path}:2: notify.webhook_url: must not hold credentials" in line
    assert not any(part in line for part in ("hunter2", "bot:", "s3cr3t", "t0k"))
    assert not (tmp_path / "home").exists()  # nothing started


def test_merge_keys_merge_as_yaml_says_explicit_keys_first_then_the_sources_in_order(tmp_path, cli):
    from fleet.config.load import load_config

    path = tmp_path / "fleet.yaml"
    path.write_text(
        "sites:\n"
        "  - {id: a, start_url: http://a.test, options: &base {item: a.x, next: a.n, max_pages: 3}}\n"
        "  - {id: b, start_url: http://b.test, options: {<<: *base, max_pages: 4}}\n"
        "  - {id: c, start_url: http://c.test, options: {<<: [{max_pages: 7, next: null}, *base], item: b.x}}\n"
    )
    code, out, err, _, _ = cli(["validate", "--config", str(path)])
    assert code == 0 and "OK: 3 sites" in out, err
    config = load_config(path)
    assert config.site("b").options == {"item": "a.x", "next": "a.n", "max_pages": 4}
    assert config.site("c").options == {"item": "b.x", "next": None, "max_pages": 7}


def test_a_crawler_by_dotted_path_is_checked_without_running_its_packages(tmp_path, cli, monkeypatch):
    pkg = tmp_path / "src" / "shopcrawl"
    pkg.mkdir(parents=True)
    marker = tmp_path / "imported"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    (pkg / "sites.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\n\nclass Shop:\n    pass\n")
    (pkg / "broken.py").write_text("class Shop(\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    path = tmp_path / "fleet.yaml"

    def check(crawler: str) -> tuple[int, str]:
        path.write_text(f"sites:\n  - {{id: a, start_url: http://a.test, crawler: '{crawler}', options: {{x: 1}}}}\n")
        code, _, err, _, _ = cli(["validate", "--config", str(path)])
        return code, err

    assert check("shopcrawl.sites:Shop") == (0, "")  # free-form options for a crawler of one's own
    code, err = check("shopcrawl.sites:Nope")
    assert code == 2 and f"{pkg / 'sites.py'} defines no 'Nope' at its top level" in err
    code, err = check("shopcrawl.broken:Shop")
    assert code == 2 and f"{pkg / 'broken.py'}:1 cannot be parsed" in err
    code, err = check("shopcrawl.sites.deeper:Shop")
    assert code == 2 and "module 'shopcrawl.sites.deeper' cannot be imported" in err
    assert not marker.exists() and "shopcrawl" not in sys.modules


def test_the_examples_still_load_in_well_under_a_second(cli):
    root = Path(__file__).resolve().parents[2] / "examples"
    for path in sorted(root.glob("*.yaml")):
        code, _, err, seconds, _ = cli(["validate", "--config", str(path)])
        assert code == 0 and seconds < 5, (path, err)


def test_every_argument_that_takes_an_id_has_its_100_kb_case():
    """The parser's own list: a command that takes a run, site, node or stream id is covered above."""
    import argparse

    from cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for command, parser in sub.choices.items():
        for action in parser._actions:
            named = action.option_strings[-1] if action.option_strings else (action.metavar or action.dest)
            if action.dest in ("run_id", "site", "node", "stream") or named == "SITE":
                found.add(f"{command} {named}")
    assert found == ID_ARGUMENTS
