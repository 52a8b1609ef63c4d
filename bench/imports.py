"""The import graph of the product, room by room: the rooms (a room is a folder of modules), their size, the
circles between modules, and the rooms that import each other both ways.

    .venv/bin/python bench/imports.py [--json]

It reads the code (grimp, as import-linter does); nothing is imported or run. A circle is a set of modules that
reach one another by imports (a strongly connected component of two or more), named with the room it lies in, or
`across` when it spans rooms. The biggest room's share is its lines over all the product's lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGES = ("fleet", "hub", "node", "lambdas", "cli", "cloud_init", "profiles", "runtime", "sim", "twin", "embedded")


def _present() -> list[str]:
    return [p for p in PACKAGES if (ROOT / p / "__init__.py").is_file()]


def _lines(module: str) -> int:
    base = ROOT.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return len(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else 0


def _room(graph: grimp.ImportGraph, module: str) -> str:
    """A package's modules live in it; a package's own `__init__` belongs to the package itself."""
    base = ROOT.joinpath(*module.split("."))
    return module if base.is_dir() else module.rpartition(".")[0] or module


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of two or more, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def measure() -> dict[str, object]:
    packages = _present()
    graph = grimp.build_graph(*packages)
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    rooms: dict[str, dict[str, int]] = {}
    for m in modules:
        room = rooms.setdefault(_room(graph, m), {"modules": 0, "lines": 0})
        room["modules"] += 1
        room["lines"] += _lines(m)
    total = sum(r["lines"] for r in rooms.values())
    circles = []
    for component in _circles(edges):
        where = {_room(graph, m) for m in component}
        circles.append({"room": where.pop() if len(where) == 1 else "across", "modules": component})
    room_edges: dict[str, set[str]] = {}
    for m, targets in edges.items():
        for t in targets:
            a, b = _room(graph, m), _room(graph, t)
            if a != b:
                room_edges.setdefault(a, set()).add(b)
    pairs = {(a, b) for a, bs in room_edges.items() for b in bs}
    both_ways = sorted((a, b) for a, b in pairs if a < b and (b, a) in pairs)
    biggest = max(rooms, key=lambda r: rooms[r]["lines"])
    return {
        "rooms": dict(sorted(rooms.items())),
        "modules": len(modules),
        "lines": total,
        "biggest_room": biggest,
        "biggest_room_share": round(rooms[biggest]["lines"] / total, 3) if total else 0.0,
        "circles": circles,
        "rooms_importing_each_other": [list(pair) for pair in both_ways],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the measure as one JSON document")
    args = parser.parse_args()
    report = measure()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    rooms = report["rooms"]
    assert isinstance(rooms, dict)
    print(f"{report['modules']} modules, {report['lines']} lines, {len(rooms)} rooms")
    for name, room in rooms.items():
        print(f"  {name:<28} {room['modules']:>3} modules {room['lines']:>6} lines")
    print(f"biggest room: {report['biggest_room']}, {report['biggest_room_share']:.1%} of the lines")
    circles = report["circles"]
    assert isinstance(circles, list)
    print(f"circles: {len(circles)}")
    for circle in circles:
        print(f"  [{circle['room']}] " + " <-> ".join(circle["modules"]))
    pairs = report["rooms_importing_each_other"]
    assert isinstance(pairs, list)
    print(f"rooms importing each other: {len(pairs)}")
    for a, b in pairs:
        print(f"  {a} <-> {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
