"""Layer rules that import-linter cannot see: how an import is made, what loads at run time, and how big a room is.

import-linter (`make lint`) checks which package may import which. Two rules need more than the import graph:
the commands reach the local stack (`embedded`), the twin and the simulator only from inside the functions that
need them, so that a command run against AWS never loads them; and the kernel (every module of `fleet` but its AWS
adapters in `fleet.aws`), the hub's planning and the simulator import with boto3 and botocore absent, not merely
without a static import of them.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
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
    from embedded.stack import StackState
else:
    import embedded.demo_pages
try:
    import embedded.imds_server
except ImportError:
    pass

class C:
    from embedded.stack import LocalStack

def f():
    from embedded.stack import LocalStack
"""
    assert eager_imports(source, "embedded") == [3, 4, 10, 12, 17]


def test_the_commands_reach_the_local_stack_the_twin_and_the_simulator_only_from_inside_functions():
    found = {
        f"{path.relative_to(ROOT)} ({package})": lines
        for path in sorted((ROOT / "cli").rglob("*.py"))
        for package in ("embedded", "twin", "sim")
        if (lines := eager_imports(path.read_text(), package))
    }
    assert found == {}, f"cli imports these when a module loads (file: lines): {found}"


#: The simulator's packages. Re-point here when the simulator moves (to a top-level `sim` package).
SIMULATOR = ("sim",)
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
    assert {"fleet.protocol", "fleet.config.load", "fleet.record.table"} <= set(kernel)
    assert ADAPTERS not in kernel and not any(m.startswith(ADAPTERS + ".") for m in kernel)
    assert "sim.run" in simulator
    done = import_without_boto([*kernel, *modules_of("hub.plan"), *simulator])
    assert done.returncode == 0, done.stderr
    refused = import_without_boto(["fleet.aws.clients"])  # the check sees a module that needs botocore
    assert refused.returncode != 0 and "import of botocore halted" in refused.stderr


SIZES = ROOT / "scripts" / "sizes.py"


def test_a_module_over_600_lines_or_a_function_over_60_fails_and_one_over_400_is_a_warning(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("def f():\n" + "    x = 1\n" * 60)
    middling = tmp_path / "middling.py"
    middling.write_text("x = 1\n" * 450)
    done = subprocess.run([sys.executable, SIZES, big, middling], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["warning", "error"], done.stdout
    assert "middling.py: 450 lines" in done.stdout and "big.py:1 f: 61 lines" in done.stdout
    huge = tmp_path / "huge.py"
    huge.write_text("x = 1\n" * 601)
    done = subprocess.run([sys.executable, SIZES, huge], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "huge.py: 601 lines (at most 600)" in done.stdout


def test_no_module_is_over_600_lines_and_no_function_over_60():
    done = subprocess.run([sys.executable, SIZES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout


#: The EC2 calls on instances, each only ever made by fleet/aws/ec2.py (`fleet.aws.ec2`): launch, describe,
#: terminate, stop, start, tags and console output.
EC2_INSTANCE_CALLS = frozenset(
    {
        "run_instances",
        "describe_instances",
        "terminate_instances",
        "stop_instances",
        "start_instances",
        "create_tags",
        "delete_tags",
        "get_console_output",
    }
)
#: What stands for EC2 itself rather than calls it: the twin's control and the simulator's cloud.
EC2_ITSELF = ("twin/", "sim/")


def test_every_ec2_instance_call_goes_through_the_one_adapter():
    calls = []
    for package in ("fleet", "hub", "node", "lambdas", "cli", "embedded", "sim", "twin"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "fleet/aws/ec2.py" or rel.startswith(EC2_ITSELF):
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                called = None
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    adapter = isinstance(node.func.value, ast.Name) and node.func.value.id == "ec2_api"
                    called = None if adapter else node.func.attr  # `ec2_api.run_instances`: the adapter's own
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    called = node.value  # get_paginator("describe_instances")
                if called in EC2_INSTANCE_CALLS:
                    calls.append(f"{rel}:{node.lineno}: {called}")
    assert calls == []
