"""Text from outside shown as text: what a config, the table, a summary or AWS holds reaches a terminal as the
characters it is, never as rich markup (`[/x]` would raise a MarkupError, `[red]` restyle the line) and never as
the terminal's own escape sequences (an ESC, a BEL: written out as `\\x1b`, `\\x07`).

Every view that prints such a value goes through here: `plain` for a string, `text` for a rich `Text`, `markup`
for a value set inside markup of ours, and `say` for a whole line of them.
"""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def plain(value: object) -> str:
    """`value` as a string with its control characters (an ANSI escape, a newline) written out as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", str(value))


def text(value: object, style: str = "") -> Text:
    """`value` as plain text (never markup) with its control characters written out."""
    return Text(plain(value), style=style)


def markup(value: object) -> str:
    """`value` escaped to sit inside markup of ours, its control characters written out."""
    return escape(plain(value))


def say(console: Console, line: object, style: str = "", *, label: str = "", label_style: str = "") -> None:
    """Print a line that holds values from outside: as plain text (no markup, no highlighting), its control
    characters written out; after a `label` of ours in its own style ("problem:" in red), if given."""
    shown = text(line, style)
    console.print(Text.assemble((f"{label} ", label_style), shown) if label else shown, highlight=False)
