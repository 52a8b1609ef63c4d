"""The house's sizes: a module a newcomer reads in one sitting, a function one screen.

    python scripts/sizes.py [PATH ...]

A module over 400 lines is a warning: it may be right (a split made only for the count leaves a circle or a
chain behind), but it asks whether it holds two things. A module over 600 lines, or a function over 60 (its
decorators excluded), fails. With no PATH, every package of the product and bench/ is measured. Exit 1 on a
failure, else 0; one line per finding.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_WARN_LINES = 400
MODULE_MAX_LINES = 600
FUNCTION_MAX_LINES = 60
PACKAGES = ("fleet", "hub", "node", "lambdas", "cli", "embedded", "sim", "twin", "cloud_init", "profiles", "bench")


def measure(path: Path) -> tuple[list[str], list[str]]:
    """(warnings, failures) for one source file."""
    source = path.read_text(encoding="utf-8")
    warnings: list[str] = []
    failures: list[str] = []
    lines = source.count("\n")
    if lines > MODULE_MAX_LINES:
        failures.append(f"{path}: {lines} lines (at most {MODULE_MAX_LINES})")
    elif lines > MODULE_WARN_LINES:
        warnings.append(f"{path}: {lines} lines (over {MODULE_WARN_LINES}: does it hold two things?)")
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_MAX_LINES:
                failures.append(f"{path}:{node.lineno} {node.name}: {length} lines (at most {FUNCTION_MAX_LINES})")
    return warnings, failures


def sources(paths: list[str]) -> list[Path]:
    """The named files, else every module of the packages (relative to the repository, as they are printed)."""
    if paths:
        return [Path(p) for p in paths]
    return [p.relative_to(ROOT) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def main(argv: list[str]) -> int:
    warned: list[str] = []
    failed: list[str] = []
    for path in sources(argv):
        w, f = measure(path if path.is_absolute() or path.exists() else ROOT / path)
        warned += w
        failed += f
    for line in warned:
        print(f"warning: {line}")
    for line in failed:
        print(f"error: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
