"""`gridfleet local up|down|status`: the embedded default's stack on its own, outside any run.

`up` leaves it running for runs, reruns and `status` to use; `down` stops it and every node it started.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from cli.envs.home import gridfleet_home
from cli.envs.local import make_stack
from fleet.errors import UsageError
from hub.loop import EXIT_OK

if TYPE_CHECKING:
    from embedded.stack import LocalStack


def cmd_local(args: argparse.Namespace, console: Console) -> int:
    if getattr(args, "twin", False):
        from cli.commands.twin import cmd_twin

        return cmd_twin(args, console)
    if getattr(args, "config", None):
        raise UsageError("--config goes with --twin (the local stack takes its sites from `run --config`)")
    stack = make_stack(gridfleet_home(), need_jar=args.action == "up", progress=lambda m: console.print(m))
    if args.action == "up":
        st = stack.up()
        print_stack(console, stack)
        console.print(f"stack directory: {st.dir}; stop it with `gridfleet local down`")
        return EXIT_OK
    if args.action == "down":
        n = stack.down(quiet=True)
        console.print(f"local stack stopped ({n} processes ended)" if n else "local stack was not running")
        return EXIT_OK
    print_stack(console, stack)
    return EXIT_OK if stack.running() else 1


def print_stack(console: Console, stack: LocalStack) -> None:
    t = Table(title=f"local stack ({stack.dir})", title_justify="left")
    for c in ("component", "state", "address", "pid"):
        t.add_column(c)
    for name, state, url, pid in stack.status():
        t.add_row(name, state, url, str(pid) if pid else "-")
    console.print(t)
