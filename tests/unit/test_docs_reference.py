"""docs/reference: the checked-in pages are what the code gives (scripts/docs_reference.py), they cover everything
they document (every option of every command, every key of fleet.yaml, every failure class, every key a real run
writes into summary.json and result.json, every metric the hub serves), every key of fleet.yaml says what it does,
and the pages are MyST whose headings keep stable anchors and whose links land."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from markdown_it.renderer import RendererHTML
from myst_parser.config.main import MdParserConfig
from myst_parser.parsers.mdit import create_md_parser
from myst_parser.slugs import github_slugify
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

import fleet.errors
import hub.loop
import node.main
from cli.main import build_parser
from cli.report.check import attach
from fleet.aws.metrics import CloudWatchSink, node_heartbeat, node_job_data
from fleet.config import Config
from fleet.crawl import pacing
from fleet.crawl.crawlers import BUILTIN_OPTIONS
from fleet.outputs.shapes import SUMMARY, Key
from fleet.record.failures import DEFAULT_RULES, FailureClass
from fleet.record.state import Reason, RunStatus
from hub.monitor import HubMonitor
from node.result import RESULT
from tests.helpers.fleet_sim import RUN, SimCloud, sim_config, viewer_hub

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "reference"
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
docs_reference: Any = importlib.import_module("docs_reference")
FIX = ".venv/bin/python scripts/docs_reference.py"


def page(name: str) -> str:
    return (PAGES / name).read_text(encoding="utf-8")


# --- the pages are the code's ------------------------------------------------------------------------------------
def test_every_checked_in_page_is_what_the_code_gives_now():
    stale = [name for name, body in docs_reference.pages().items() if page(name) != body]
    assert not stale, f"docs/reference/{', '.join(stale)} differ from what the code gives: run `{FIX}`"


def test_check_names_each_page_that_differs_and_how_to_fix_it_and_writing_makes_them_match(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(docs_reference, "OUT", tmp_path)
    assert docs_reference.main([]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(docs_reference.pages())
    assert docs_reference.main(["--check"]) == 0
    (tmp_path / "failures.md").write_text("# edited by hand\n")
    (tmp_path / "metrics.md").unlink()
    capsys.readouterr()
    assert docs_reference.main(["--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "docs/reference/failures.md differs from what the code gives",
        "docs/reference/metrics.md differs from what the code gives",
        f"run `{FIX}` to write the reference pages again",
    ]
    assert docs_reference.main([]) == 0 and docs_reference.main(["--check"]) == 0
    with pytest.raises(SystemExit) as bad:
        docs_reference.main(["--chek"])
    assert bad.value.code == 2


# --- fleet.yaml: every key described, every key on the page --------------------------------------------------------
def _resolve(schema: dict[str, Any], prop: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The model a property holds (its schema definition) and how its path goes on: "", "[]" or ".<key>"."""
    defs = schema.get("$defs", {})
    for candidate, tail in (
        (prop, ""),
        *((arm, "") for arm in prop.get("anyOf", [])),
        (prop.get("items") or {}, "[]"),
        (prop.get("additionalProperties") or {}, ".<key>"),
    ):
        if isinstance(candidate, dict) and "$ref" in candidate:
            return defs[candidate["$ref"].rsplit("/", 1)[1]], tail
    return None, ""


def schema_keys(schema: dict[str, Any], model: dict[str, Any], path: str = "") -> list[tuple[str, bool, bool]]:
    """(path, described, leaf) of every key of `model` in `schema` (a model's JSON Schema), depth first. A key holding
    a section is described by its own description or its section's (its model's docstring)."""
    out = []
    for name, prop in model.get("properties", {}).items():
        inner, tail = _resolve(schema, prop)
        here = f"{path}.{name}" if path else name
        out.append((here, bool(prop.get("description") or (inner or {}).get("description")), inner is None))
        if inner is not None:
            out += schema_keys(schema, inner, here + tail)
    return out


def all_schema_keys() -> list[tuple[str, bool, bool]]:
    schema = Config.model_json_schema()
    out = schema_keys(schema, schema)
    for options in BUILTIN_OPTIONS.values():
        s = options.model_json_schema()
        out += schema_keys(s, s, "sites[].options")
    return out


def undescribed(model: type[BaseModel]) -> list[str]:
    schema = model.model_json_schema()
    return [path for path, described, _ in schema_keys(schema, schema) if not described]


def test_the_description_lint_names_each_key_without_a_description():
    class Inner(BaseModel):
        a: int = 1

    class Outer(BaseModel):
        inner: Inner = Inner()
        b: str = "x"

    assert undescribed(Outer) == ["inner", "inner.a", "b"]


def test_every_key_of_fleet_yaml_says_what_it_does():
    missing = [path for path, described, _ in all_schema_keys() if not described]
    assert not missing, "keys of fleet.yaml without a description (Field(description=...)): " + ", ".join(missing)


def test_every_key_of_fleet_yaml_is_on_its_page():
    text = page("fleet-yaml.md")
    keys = all_schema_keys()
    assert len([k for k in keys if k[2]]) > 120  # the leaves: run, fleet, aws, ... and the built-in crawlers'
    missing = [path for path, _, leaf in keys if leaf and f"| `{path}` |" not in text]
    assert not missing, f"keys not on docs/reference/fleet-yaml.md: {missing} (run `{FIX}`)"


# --- the command line ---------------------------------------------------------------------------------------------
def parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [p]
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                out += parsers(sub)
    return out


def test_every_command_and_option_of_the_parser_is_on_the_cli_page():
    text = page("cli.md")
    for p in [*parsers(build_parser()), node.main.parser()]:
        if p.prog == "gridfleet node" and not p._actions:
            continue  # the top parser's stand-in: the agent's own parser is the one above
        assert f"## `{p.prog}`" in text, p.prog
        section = text.split(f"## `{p.prog}`\n", 1)[1].split("\n## ", 1)[0]
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(f"`{sub.prog}`" in section for sub in action.choices.values())
            for flag in action.option_strings:
                assert f"`{flag}`" in section, f"{p.prog} {flag}"
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert f"| `{action.metavar or action.dest}` |" in section, f"{p.prog} {action.dest}"


def test_the_node_agents_own_commands_are_on_the_cli_page_with_every_option_their_source_adds():
    text = page("cli.md")
    for word in ("kill", "report-failure", "site-mounts", "site-mount"):
        assert f"## `gridfleet node {word}`" in text
    sources = (ROOT / "node" / "main.py").read_text() + (ROOT / "node" / "site_mounts.py").read_text()
    flags = set(re.findall(r"ap\.add_argument\(\s*\"(--[a-z-]+)\"", sources))
    assert {"--attempt", "--message", "--socket"} <= flags
    assert all(f"`{flag}`" in text for flag in flags), flags


def test_every_exit_code_its_meaning_and_every_error_are_on_the_pages():
    constants = {n: v for n, v in vars(hub.loop).items() if n.startswith("EXIT_") and isinstance(v, int)}
    assert set(constants.values()) == set(hub.loop.EXIT_CODES), "every exit code says what it means"
    assert build_parser().epilog == "Exit codes: " + "; ".join(f"{c} {m}" for c, m in hub.loop.EXIT_CODES.items()) + "."
    for name in ("cli.md", "exit-codes.md"):
        for constant, value in constants.items():
            assert f"| `{value}` | `{constant}` | {hub.loop.EXIT_CODES[value]} |" in page(name)
    errors = [
        v for v in vars(fleet.errors).values() if isinstance(v, type) and issubclass(v, fleet.errors.GridfleetError)
    ]
    assert all(f"| `{e.__name__}` |" in page("exit-codes.md") and e.__doc__ for e in errors)


# --- failures -------------------------------------------------------------------------------------------------------
def test_every_failure_class_rule_and_reason_is_on_the_failures_page():
    text = page("failures.md")
    assert all(f"| `{c.value}` |" in text for c in FailureClass)
    assert all(f"| `{key}` |" in text for key in DEFAULT_RULES)
    assert all(f"| `{r.value}` |" in text for r in Reason)
    assert "| `http_404` | `http_4xx` | fail |" in text and "| `blocked` |" in text


# --- summary.json and result.json -------------------------------------------------------------------------------
_JSON = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def _is(value: Any, kind: str) -> bool:
    for t in kind.split(" | "):
        if t == "null" and value is None:
            return True
        if t != "null" and isinstance(value, _JSON[t]) and (t == "boolean" or not isinstance(value, bool)):
            return True
    return False


def shape_problems(value: Any, key: Key, path: str, seen: set[str]) -> list[str]:
    """What in `value` its shape does not describe, or describes otherwise; every path met goes into `seen`."""
    seen.add(path)
    problems = [] if _is(value, key.type) else [f"{path}: {value!r} is not {key.type}"]
    if key.values and isinstance(value, str) and value not in key.values:
        problems.append(f"{path}: {value!r} is none of {key.values}")
    if isinstance(value, dict) and key.keys is not None:
        for name, v in value.items():
            sub = key.keys.get(name)
            here = f"{path}.{name}".lstrip(".")
            problems += [f"{here}: not in the shape"] if sub is None else shape_problems(v, sub, here, seen)
        problems += [
            f"{path}.{n}: missing, but always there" for n, k in key.keys.items() if not k.when and n not in value
        ]
    elif isinstance(value, dict) and key.each is not None:
        for v in value.values():
            problems += shape_problems(v, key.each, f"{path}.<{key.named}>", seen)
    elif isinstance(value, list) and key.each is not None:
        for v in value:
            problems += shape_problems(v, key.each, f"{path}[]", seen)
    return problems


def described_paths(keys: dict[str, Key] | Any, path: str = "") -> set[str]:
    out = set()
    for name, key in keys.items():
        here = f"{path}.{name}" if path else name
        out.add(here)
        while key.each is not None and key.keys is None:
            here += "[]" if key.type == "array" else f".<{key.named}>"
            key = key.each
            out.add(here)
        if key.keys is not None:
            out |= described_paths(key.keys, here)
    return out


SITES = {"a": "ok", "h": "hang-always", "f": "error-always"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real run of the hub and agents on the in-memory fakes, one site of each ending, its own check attached as
    `gridfleet run` attaches it, and the hub's monitor of it (a CloudWatch that records what it is sent)."""
    tmp = tmp_path_factory.mktemp("run")
    cloud = SimCloud(tmp, sim_config(SITES), dict(SITES))
    # a domain's pacing counters, as the nodes' crawls of a paced domain leave them in the table
    cloud.table.items[(pacing.PACING_PARTITION_PREFIX + RUN, "a.test")] = {
        "Site": "a.test",
        "requests": 3,
        "base_s": 1.0,
        "base_from": pacing.FROM_CRAWL_DELAY,
        "backoffs": 0,
        "spacing_s": 1.0,
    }
    cloud.start_hub()
    cloud.run()
    sent: list[dict[str, Any]] = []
    cw = type("CloudWatch", (), {"put_metric_data": lambda self, **kw: sent.append(kw)})()
    mon = HubMonitor(RUN, cloud.config, cloud.queue, cloud.clock, CloudWatchSink(cw, "gridfleet", cloud.clock))
    viewer = viewer_hub(cloud, tmp / "viewer")
    for _ in range(2):  # the second publish carries the kills since the first
        mon.observe(viewer.snapshot(cloud.clock.now()), finished=True)
    summary_path = cloud.outcomes[-1].summary_path
    attach(cloud.check(), summary_path)
    return cloud, json.loads(summary_path.read_text()), mon, sent


def test_summary_json_of_a_real_run_is_what_its_shape_describes(finished):
    cloud, summary, _, _ = finished
    assert {e["run_status"] for e in summary["sites"].values()} == {"COMPLETED", "FAILED"}
    seen: set[str] = set()
    assert shape_problems(summary, Key("object", "summary.json", keys=SUMMARY), "", seen) == []
    # Every key the shape describes is one the writers write: this run writes them all but what needs a crawler
    # project or two items of one id.
    unseen = {p for p in described_paths(SUMMARY) - seen if not p.endswith(("[]", ">"))}  # not: an empty list's items
    assert unseen == {
        "crawlers",
        "crawlers.name",
        "crawlers.version",
        "crawlers.hash",
        "sites.<site id>.attempts[].collided",
    }


def test_a_result_json_of_a_real_run_is_what_its_shape_describes(finished):
    cloud, summary, _, _ = finished
    body = json.loads(cloud.results.get(summary["sites"]["a"]["result_key"]))
    seen: set[str] = set()
    assert shape_problems(body, Key("object", "result.json", keys=RESULT), "", seen) == []
    assert described_paths(RESULT) - seen == set() and len(body["items"]) == 3 and body["pages"] == 3


def test_the_summary_page_has_every_key_of_both_shapes():
    text = page("summary.md")
    for shape in (SUMMARY, RESULT):
        for path in described_paths(shape):
            assert f"| `{path}` |" in text or path.endswith(("[]", ">")), path
    assert {v.value for v in RunStatus} <= set(re.findall(r"`([A-Z_]+)`", text))


# --- metrics ------------------------------------------------------------------------------------------------------
def row(text: str, name: str) -> str:
    rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
    assert rows, f"{name} is not on docs/reference/metrics.md"
    return "\n".join(rows)


def test_every_prometheus_family_the_hub_serves_is_on_the_metrics_page_with_its_type_and_labels(finished):
    _, _, mon, _ = finished
    text = page("metrics.md")
    served = list(text_string_to_metric_families(generate_latest(mon.registry).decode()))
    assert len(served) == 15  # every family: the run had sites, attempts, kills, nodes and a queue
    for family in served:
        line = row(text, family.name)
        assert f"| {family.type} |" in line, family.name
        for sample in family.samples:
            assert f"`{sample.name}`" in line
            assert all(f"`{label}`" in line for label in sample.labels), (family.name, sample.labels)


def test_every_cloudwatch_metric_the_hub_and_nodes_put_is_on_the_metrics_page_with_its_dimensions(finished):
    _, _, _, sent = finished
    text = page("metrics.md")
    data = [d for call in sent for d in call["MetricData"]]
    data += [d.to_api(0) for d in (*node_job_data("i-1", 1.0, None), *node_job_data("i-1", 1.0, "hang"))]
    data.append(node_heartbeat("i-1").to_api(0))
    assert {d["MetricName"] for d in data} >= {"ActiveNodes", "Kills", "JobErrors", "Heartbeat"}
    for d in data:
        dims = ", ".join(f"`{x['Name']}`" for x in d.get("Dimensions", []))
        assert f"| `{d['MetricName']}` | `{d['Unit']}` | {dims} |" in row(text, d["MetricName"]), d


def test_no_module_but_the_pages_sources_defines_a_metric():
    made = re.compile(r"\b\w*MetricFamily\(|\bDatum\(|\b(?:Gauge|Counter|Histogram|Summary|Info|Enum)\(\s*['\"]")
    packages = ("fleet", "hub", "node", "lambdas", "cli", "embedded", "sim", "twin", "cloud_init", "profiles")
    found = {
        str(p.relative_to(ROOT))
        for pkg in packages
        for p in (ROOT / pkg).rglob("*.py")
        if made.search(p.read_text(encoding="utf-8"))
    }
    metrics_page = importlib.import_module("reference_pages.metrics_page")
    assert found == set(metrics_page.PROMETHEUS_SOURCES) | set(metrics_page.CLOUDWATCH_SOURCES)


# --- MyST: no raw HTML, stable anchors, links that land -------------------------------------------------------------
MYST = create_md_parser(MdParserConfig(), RendererHTML)


def anchors(name: str) -> tuple[list[tuple[int, str]], list[str]]:
    """(level, slug) of each heading of a page, and the targets of its links."""
    tokens = MYST.parse(page(name))
    heads, links = [], []
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            title = "".join(c.content for c in tokens[i + 1].children or [] if c.type in ("text", "code_inline"))
            heads.append((int(t.tag[1]), github_slugify(title)))
        if t.type == "inline":
            links += [str(c.attrs["href"]) for c in t.children or [] if c.type == "link_open"]
    return heads, links


@pytest.mark.parametrize("name", sorted(p.name for p in PAGES.glob("*.md")))
def test_a_page_is_myst_without_raw_html_its_tables_even_and_its_headings_unique(name):
    text = page(name)
    kinds = {t.type for t in MYST.parse(text)} | {c.type for t in MYST.parse(text) for c in t.children or []}
    assert not kinds & {"html_inline", "html_block"}, "raw HTML"
    heads, _ = anchors(name)
    assert [level for level, _ in heads].count(1) == 1 and heads[0][0] == 1
    assert all(b <= a + 1 for (a, _), (b, _) in zip(heads, heads[1:], strict=False)), "a heading skips a level"
    slugs = [s for _, s in heads]
    assert len(slugs) == len(set(slugs)), f"headings share an anchor: {sorted(s for s in slugs if slugs.count(s) > 1)}"
    assert "do not edit by hand" in text.split("\n\n")[1] and FIX in text.split("\n\n")[1]
    cells = re.compile(r"(?<!\\)\|")
    for table in re.findall(r"(?:^\|.*\n)+", text, flags=re.MULTILINE):
        counts = {len(cells.findall(line)) for line in table.splitlines()}
        assert len(counts) == 1, f"a table's rows differ in cells:\n{table}"


def test_every_link_of_the_pages_lands_on_a_page_and_a_heading_myst_anchors():
    linkable = {
        name: {s for level, s in anchors(name)[0] if level <= 3} for name in (p.name for p in PAGES.glob("*.md"))
    }
    for name in linkable:
        for href in anchors(name)[1]:
            target, _, anchor = href.partition("#")
            target = target or name
            assert target in linkable, f"{name}: {href}"
            assert not anchor or anchor in linkable[target], f"{name}: {href} has no heading"
