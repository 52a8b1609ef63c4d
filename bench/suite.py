"""Where the test suite's time goes: the time of its tests by top-level directory (unit, adapter, faults, e2e,
twin, infra, examples), and the suite's wall time.

    .venv/bin/python bench/suite.py                      # runs the suite as `make test` does, then reports
    .venv/bin/python bench/suite.py -n 0 -- tests/unit   # serial, only tests/unit (what follows -- goes to pytest)
    .venv/bin/python bench/suite.py --junit run.xml      # reads a run already made (pytest --junitxml=run.xml)

A test's time is pytest's: its set-up, call and tear-down, so a fixture shared by several tests is counted with
the first test that asked for it. The sum of a directory's times is the time one worker spends on it; with
workers the wall time is less than the total of the sums. The wall time is the one measured around pytest, or,
for an XML read, the time pytest wrote in it. This is a benchmark, not a test: run it on an idle machine to
compare figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The directories in the order the table lists them; any other found is listed after them.
ORDER = ("unit", "adapter", "faults", "infra", "e2e", "twin", "examples")


@dataclass
class Row:
    tests: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0


def directory_of(classname: str) -> str:
    """`tests.unit.test_x.TestY` -> unit; a test outside tests/ (examples/crawlers/tests) -> its first folder."""
    parts = classname.split(".")
    if parts[0] == "tests" and len(parts) > 2:
        return parts[1]
    return parts[0] or "?"


def read_junit(path: Path) -> tuple[dict[str, Row], float | None]:
    """Rows by directory, and the run's wall time (None when the XML has none)."""
    tree = ET.parse(path)
    rows: dict[str, Row] = {}
    wall = 0.0
    for suite in tree.getroot().iter("testsuite"):
        wall += float(suite.get("time") or 0.0)
    for case in tree.getroot().iter("testcase"):
        row = rows.setdefault(directory_of(case.get("classname") or ""), Row())
        row.tests += 1
        row.seconds += float(case.get("time") or 0.0)
        if case.find("failure") is not None or case.find("error") is not None:
            row.failed += 1
        elif case.find("skipped") is not None:
            row.skipped += 1
    return rows, (wall or None)


def run_suite(junit: Path, workers: int, pytest_args: list[str]) -> tuple[int, float]:
    """The suite run as `make test` runs it, its junit XML written to `junit`; pytest's exit code, the wall time."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    if workers:
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    started = time.monotonic()
    rc = subprocess.run([*cmd, *pytest_args], cwd=ROOT).returncode
    return rc, time.monotonic() - started


def table(rows: dict[str, Row], wall: float | None) -> str:
    names = [n for n in ORDER if n in rows] + sorted(n for n in rows if n not in ORDER)
    total = sum(r.seconds for r in rows.values()) or 1.0
    out = [f"{'directory':<10} {'tests':>6} {'failed':>6} {'skipped':>7} {'seconds':>9} {'share':>6}"]
    for n in names:
        r = rows[n]
        out.append(f"{n:<10} {r.tests:>6} {r.failed:>6} {r.skipped:>7} {r.seconds:>9.1f} {r.seconds / total:>6.0%}")
    tests = sum(r.tests for r in rows.values())
    failed = sum(r.failed for r in rows.values())
    skipped = sum(r.skipped for r in rows.values())
    out.append(f"{'total':<10} {tests:>6} {failed:>6} {skipped:>7} {sum(r.seconds for r in rows.values()):>9.1f}")
    if wall is not None:
        out.append(f"{'wall time':<10} {'':>6} {'':>6} {'':>7} {wall:>9.1f}  ({wall / 60:.1f} min)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--junit", type=Path, help="read this junit XML of a run already made instead of running")
    ap.add_argument(
        "-n", "--workers", type=int, default=os.cpu_count() or 2, help="xdist workers (0: serial; default: cores)"
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    ap.add_argument("pytest_args", nargs="*", help="after --: more arguments for pytest (e.g. a directory)")
    args = ap.parse_args(argv)
    rc = 0
    if args.junit is not None:
        rows, wall = read_junit(args.junit)
    else:
        with tempfile.TemporaryDirectory(prefix="gridfleet-suite-") as tmp:
            junit = Path(tmp) / "suite.xml"
            rc, measured = run_suite(junit, args.workers, args.pytest_args)
            if not junit.is_file():
                print(f"suite: pytest wrote no junit XML (exit code {rc})", file=sys.stderr)
                return rc or 1
            rows, wall = read_junit(junit)
            wall = measured
    if args.json:
        figures = {n: vars(r) for n, r in rows.items()}
        print(json.dumps({"directories": figures, "wall_s": wall}, indent=2))
    else:
        print(table(rows, wall))
    return rc


if __name__ == "__main__":
    sys.exit(main())
