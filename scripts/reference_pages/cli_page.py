"""cli.md: every command of `gridfleet`, from the parser `cli.main.build_parser()` builds, and the node agent's
commands from `node.main`, which parses its own arguments (`gridfleet node` runs it as a program of its own)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

from reference_pages import exits_page
from reference_pages.markdown import Page, code, codes, link, text

#: Usage synopses are wrapped at this width, whatever the terminal: the page is the same on every machine.
USAGE_WIDTH = 100


@dataclass(frozen=True)
class Command:
    """One command: its parser, the one-line help its parent lists it with, and its subcommands' names."""

    parser: argparse.ArgumentParser
    summary: str
    children: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.parser.prog


def subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, help) of each subcommand of `parser`, in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name, "")


def walk(parser: argparse.ArgumentParser, summary: str = "") -> Iterator[Command]:
    """The command of `parser`, then each of its subcommands and theirs, depth first. `gridfleet node` is the node
    agent's own parser (`node.main.parser`) and its own commands (`node.main.COMMANDS`)."""
    subs = list(subparsers(parser))
    yield Command(parser, summary, tuple(sub.prog for _, sub, _ in subs))
    for name, sub, help_text in subs:
        if name == "node" and not sub._actions:
            yield from node_commands(help_text)
        else:
            yield from walk(sub, help_text)


def node_commands(summary: str) -> Iterator[Command]:
    import node.main as node_main  # the node agent: imported here only, as `gridfleet node` runs it

    subs = [c.parser() for c in node_main.COMMANDS.values()]
    yield Command(node_main.parser(), summary, tuple(p.prog for p in subs))
    for p in subs:
        yield Command(p, "")


# --- the page --------------------------------------------------------------------------------------------------
def usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="usage: ")
    return formatter.format_help().strip()


def shown_default(action: argparse.Action) -> str:
    """The default worth showing: not None, not SUPPRESS, not a flag's off state, not help's."""
    d = action.default
    if d is None or d is argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction) and d is not action.const:
        return ""
    if isinstance(d, list | tuple) and not d:
        return ""
    return code(d, cell=True)


def argument_row(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    names = codes(action.option_strings) if action.option_strings else code(action.metavar or action.dest, cell=True)
    value = ""
    if action.nargs != 0:
        default_metavar = action.dest.upper() if action.option_strings else action.dest
        value = code(formatter._format_args(action, default_metavar), cell=True)
    help_text = formatter._expand_help(action) if action.help and action.help is not argparse.SUPPRESS else ""
    return [
        names,
        value,
        shown_default(action),
        codes(action.choices) if action.choices else "",
        "yes" if action.required else "",
        text(help_text, cell=True),
    ]


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]


def command_section(page: Page, cmd: Command) -> None:
    page.heading(2, cmd.name, as_code=True)
    for paragraph in dict.fromkeys(t for t in (cmd.summary, cmd.parser.description) if t):
        page.para(text(paragraph))
    page.code_block(usage(cmd.parser))
    rows = [argument_row(cmd.parser, a) for a in arguments(cmd.parser)]
    if rows:
        page.table(["Argument", "Value", "Default", "Choices", "Required", "Help"], rows)
    if cmd.children:
        page.para("Commands: " + ", ".join(link(code(c), c) for c in cmd.children) + ".")
    raw = isinstance(cmd.parser.formatter_class, type) and issubclass(
        cmd.parser.formatter_class, argparse.RawDescriptionHelpFormatter
    )
    if cmd.parser.epilog and raw:
        page.code_block(cmd.parser.epilog)  # laid out by hand (an example): shown as `--help` shows it
    elif cmd.parser.epilog:
        page.para(text(cmd.parser.epilog))


def render(root: argparse.ArgumentParser) -> str:
    commands = list(walk(root))
    page = Page(
        "Command line",
        "`cli.main.build_parser()` (and, for `gridfleet node`, the parsers of `node.main`)",
    )
    page.para(
        "Every command and option of `gridfleet`, as its parser defines them; `--help` after any command says the "
        "same. Defaults are shown where an option has one. The exit codes are below and in "
        "[Exit codes](exit-codes.md)."
    )
    page.table(
        ["Command", "What it does"],
        [[link(code(c.name), c.name), text(c.summary or c.parser.description or "", cell=True)] for c in commands],
    )
    for cmd in commands:
        command_section(page, cmd)
    page.heading(2, "Exit codes")
    exits_page.codes_table(page)
    return page.render()
