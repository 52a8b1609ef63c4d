"""Layer rules that import-linter cannot see: how an import is made, what loads at run time, and how big a room is.

import-linter (`make lint`) checks which package may import which. Two rules need more than the import graph:
the commands reach the local stack (`embedded`) only from inside the functions that need it, so that a command
run against AWS never loads it; and the kernel (every module of `fleet` but its AWS adapters in `fleet.aws`), the
hub's planning and the simulator import with boto3 and botocore absent, not merely without a static import of them.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def eager_imports(source: str, package: str) -> list[int]:
    """Lines of the imports of `package` (or its modules) made when the module loads: at its top level, or in a
    class body or a top-level `if`/`try`, but not under `if TYPE_CHECKING:` and not inside a function."""
    lines: list[int] = []

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.ImportFrom):
            return [node.module or ""] if node.level == 0 else []
        return [alias.name for alias in node.names]

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if any(n == package or n.startswith(package + ".") for n in names(node)):
                    lines.append(node.lineno)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(part)
            elif isinstance(node, (ast.With, ast.ClassDef)):
                visit(node.body)

    visit(ast.parse(source).body)
    return lines


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def test_eager_imports_are_told_from_lazy_ones():
    source = """
from typing import TYPE_CHECKING
import embedded.stack
from embedded import demo_server
import embeddedx
from .embedded import thing
if TYPE_CHECKING:
    from embedded.sim.run import SimParams
else:
    import embedded.fakes
try:
    import embedded.vclock
except ImportError:
    pass

class C:
    from embedded.stack import LocalStack

def f():
    from embedded.stack import LocalStack
"""
    assert eager_imports(source, "embedded") == [3, 4, 10, 12, 17]


def test_the_commands_reach_the_local_stack_only_from_inside_functions():
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "cli").glob("*.py"))
        if (lines := eager_imports(path.read_text(), "embedded"))
    }
    assert found == {}, f"cli imports embedded when a module loads (file: lines): {found}"


#: The simulator's packages. Re-point here when the simulator moves (to a top-level `sim` package).
SIMULATOR = ("embedded.sim",)
#: The kernel's AWS adapters, the one part of `fleet` that loads boto3.
ADAPTERS = "fleet.aws"


def modules_of(package: str, skip: str | None = None) -> list[str]:
    """`package` and every module under it, read from the files (nothing is imported), but `skip` and its own."""
    found = [package]
    for info in pkgutil.iter_modules([str(ROOT.joinpath(*package.split(".")))], package + "."):
        if info.name != skip:
            found += modules_of(info.name, skip) if info.ispkg else [info.name]
    return found


def import_without_boto(modules: list[str]) -> subprocess.CompletedProcess[str]:
    """Import `modules` in a fresh interpreter where boto3 and botocore cannot be imported."""
    code = (
        "import importlib, sys\n"
        "sys.modules['boto3'] = sys.modules['botocore'] = None\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *modules], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_kernel_the_hubs_planning_and_the_simulator_import_without_boto3_or_botocore():
    kernel = modules_of("fleet", skip=ADAPTERS)
    simulator = [m for package in SIMULATOR for m in modules_of(package)]
    assert {"fleet.protocol", "fleet.config.load", "fleet.table"} <= set(kernel)
    assert ADAPTERS not in kernel and not any(m.startswith(ADAPTERS + ".") for m in kernel)
    assert "embedded.sim.run" in simulator
    done = import_without_boto([*kernel, *modules_of("hub.plan"), *simulator])
    assert done.returncode == 0, done.stderr
    refused = import_without_boto(["fleet.aws.clients"])  # the check sees a module that needs boto3
    assert refused.returncode != 0 and "boto3" in refused.stderr


#: The size of a room: a module a newcomer reads in one sitting, a function one screen. A module over
#: MODULE_WARN_LINES is a warning, not a failure: two modules that would import each other read better merged, up
#: to MODULE_MAX_LINES.
MODULE_WARN_LINES = 400
MODULE_MAX_LINES = 600
FUNCTION_MAX_LINES = 60
PACKAGES = ("fleet", "hub", "node", "lambdas", "cli", "embedded", "cloud_init", "profiles", "bench")


def oversized(path: Path, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """What in one source file is over the house's sizes (the module, or a function, its decorators excluded), and
    whether the module is over the warning's size."""
    source = path.read_text()
    over, long = [], []
    lines = source.count("\n")
    if lines > MODULE_MAX_LINES:
        over.append(f"{path.relative_to(root)}: {lines} lines")
    elif lines > MODULE_WARN_LINES:
        long.append(f"{path.relative_to(root)}: {lines} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_MAX_LINES:
                over.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines")
    return over, long


def test_no_module_is_over_600_lines_and_no_function_over_60_and_a_module_over_400_is_a_warning(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("def f():\n" + "    x = 1\n" * 60 + "\n" * 600)
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * 450)
    assert len(oversized(big, tmp_path)[0]) == 2  # the check sees both kinds
    assert oversized(long, tmp_path) == ([], ["long.py: 450 lines"])
    found = [oversized(path) for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))]
    for module in (m for _, long_ones in found for m in long_ones):
        warnings.warn(f"{module}: over {MODULE_WARN_LINES} (the limit is {MODULE_MAX_LINES})", stacklevel=1)
    assert [f for over, _ in found for f in over] == []
