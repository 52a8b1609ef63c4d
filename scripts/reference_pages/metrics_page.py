"""metrics.md: the Prometheus families the hub serves at /metrics and the CloudWatch metrics the hub and the nodes
put, read from the code that defines them (each family's and datum's constructor call)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleet.aws.metrics import Datum
from reference_pages.markdown import Page, code, codes, first_paragraph, text

ROOT = Path(__file__).resolve().parents[2]
#: Where the metrics are made: the hub's families and gauges, the nodes' data.
PROMETHEUS_SOURCES = ("hub/monitor.py",)
CLOUDWATCH_SOURCES = ("hub/monitor.py", "fleet/aws/metrics.py")
#: The family classes of prometheus_client, the type of each, and the samples it is served as.
FAMILIES = {
    "GaugeMetricFamily": ("gauge", ("",)),
    "CounterMetricFamily": ("counter", ("_total",)),
    "SummaryMetricFamily": ("summary", ("_count", "_sum")),
}


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    where: str

    @property
    def samples(self) -> tuple[str, ...]:
        return tuple(self.name + suffix for suffix in FAMILIES[self.kind_class][1])

    @property
    def kind_class(self) -> str:
        return next(k for k, (kind, _) in FAMILIES.items() if kind == self.kind)


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    dims: tuple[str, ...]
    value: str
    where: str


def _constant(node: ast.expr, what: str, where: str) -> str:
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        raise ValueError(f"{where}: {what} is not a string literal: {ast.unparse(node)}")
    return node.value


def functions(path: str) -> Iterator[tuple[str, ast.FunctionDef]]:
    """(qualified name, function) of each function of a module, methods as Class.method."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    module = path.removesuffix(".py").replace("/", ".")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield f"{module}.{node.name}", node
        if isinstance(node, ast.ClassDef):
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    yield f"{module}.{node.name}.{f.name}", f


def _calls(fn: ast.FunctionDef, names: set[str]) -> list[ast.Call]:
    """The calls of `names` in `fn`, in the order of the source."""
    found = [
        node
        for node in ast.walk(fn)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
    ]
    return sorted(found, key=lambda c: (c.lineno, c.col_offset))


def families() -> list[Family]:
    out = []
    for path in PROMETHEUS_SOURCES:
        for where, fn in functions(path):
            for call in _calls(fn, set(FAMILIES)):
                assert isinstance(call.func, ast.Name)
                labels = next((k.value for k in call.keywords if k.arg == "labels"), None)
                names = (
                    tuple(_constant(e, "a label", where) for e in labels.elts) if isinstance(labels, ast.List) else ()
                )
                kind = FAMILIES[call.func.id][0]
                name, doc = (_constant(a, "a family's name or help", where) for a in call.args[:2])
                out.append(Family(name, kind, doc, names, where))
    return out


def _dims(node: ast.expr | None, fn: ast.FunctionDef) -> tuple[str, ...]:
    """The dimension names of a datum's `dims`, in order: the (name, value) pairs in it, through the names of `fn`
    it is made of (`w + (("ErrorType", e),)`)."""
    assigned = {
        t.id: a.value for a in ast.walk(fn) if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)
    }

    def names(n: ast.expr) -> list[str]:
        if isinstance(n, ast.Tuple) and len(n.elts) == 2 and isinstance(n.elts[0], ast.Constant):
            return [str(n.elts[0].value)]
        if isinstance(n, ast.Name) and n.id in assigned:
            return names(assigned[n.id])
        return [d for c in ast.iter_child_nodes(n) if isinstance(c, ast.expr) for d in names(c)]

    return tuple(names(node)) if node is not None else ()


def cloudwatch() -> list[Metric]:
    default_unit = str(next(f.default for f in dataclasses.fields(Datum) if f.name == "unit"))
    out = []
    for path in CLOUDWATCH_SOURCES:
        for where, fn in functions(path):
            for call in _calls(fn, {"Datum"}):
                args: dict[int | str, ast.expr] = dict(enumerate(call.args))
                args.update((k.arg, k.value) for k in call.keywords if k.arg is not None)
                unit = args.get(2, args.get("unit"))
                out.append(
                    Metric(
                        _constant(args[0], "a metric's name", where),
                        default_unit if unit is None else _constant(unit, "a unit", where),
                        _dims(args.get(3, args.get("dims")), fn),
                        ast.unparse(args[1]),
                        where,
                    )
                )
    return out


def render() -> str:
    from hub.http_server import __doc__ as http_doc
    from node.agent import METRIC_BEAT_S

    page = Page(
        "Metrics",
        "the metric families of `hub.monitor` and the CloudWatch data of `hub.monitor` and `fleet.aws.metrics`",
    )
    page.para(text(first_paragraph(http_doc)))
    page.heading(2, "Prometheus")
    page.para(
        text(
            "The hub serves these at `/metrics` while `hub.http` is on (`hub.bind`, `hub.port`), computed at each "
            "scrape from its latest look at the run (the table and the instances), so a restarted hub serves the "
            "same figures. A counter is served as its name with `_total`, a summary as `_count` and `_sum`."
        )
    )
    page.table(
        ["Metric", "Type", "Labels", "Help", "Samples"],
        [
            [code(f.name, cell=True), f.kind, codes(f.labels), text(f.help, cell=True), codes(f.samples)]
            for f in families()
        ],
    )
    page.heading(2, "CloudWatch")
    page.para(
        text(
            "Put in the namespace `metrics.namespace` while `metrics.cloudwatch` is on: the hub's gauges at most every "
            "`metrics.interval_s`; each node's as each of its jobs ends, and its heartbeat at most every "
            f"{METRIC_BEAT_S:g} seconds. The value is as the code computes it."
        )
    )
    page.table(
        ["Metric", "Unit", "Dimensions", "Value", "Put by"],
        [
            [code(m.name), code(m.unit), codes(m.dims), code(m.value, cell=True), code(m.where, cell=True)]
            for m in cloudwatch()
        ],
    )
    return page.render()
