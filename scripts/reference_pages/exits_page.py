"""exit-codes.md: what `gridfleet` exits with (`hub.loop.EXIT_CODES`), the exit code of each error it raises on
purpose (`fleet.errors`), and what the commands themselves say of theirs."""

from __future__ import annotations

import argparse
import re

import fleet.errors
import hub.loop
from reference_pages.markdown import Page, code, codes, first_paragraph, link, one_line, text

#: Where a text names an exit code: "exit 0", "exits 3", "Exit codes: 0".
_SAYS_EXIT = re.compile(r"\bexit(?:s| codes?:?)? \d", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=\S)")


def exit_sentences(texts: list[str]) -> list[str]:
    """The sentences of `texts` that name an exit code, each once."""
    found = [s for t in texts for s in _SENTENCE_END.split(one_line(t)) if _SAYS_EXIT.search(s)]
    return list(dict.fromkeys(found))


def names_of(value: int) -> list[str]:
    """The constants of `hub.loop` that hold exit code `value`."""
    return [
        name
        for name, v in vars(hub.loop).items()
        if name.startswith("EXIT_") and isinstance(v, int) and not isinstance(v, bool) and v == value
    ]


def codes_table(page: Page) -> None:
    page.table(
        ["Code", "Constant", "Meaning"],
        [[code(c), codes(names_of(c)), text(m, cell=True)] for c, m in hub.loop.EXIT_CODES.items()],
    )


def errors() -> list[type[fleet.errors.GridfleetError]]:
    """The errors `fleet.errors` defines, in its order (the base first)."""
    return [
        v
        for v in vars(fleet.errors).values()
        if isinstance(v, type) and issubclass(v, fleet.errors.GridfleetError) and v.__module__ == fleet.errors.__name__
    ]


def render(root: argparse.ArgumentParser) -> str:
    from reference_pages.cli_page import walk  # cli_page shows the codes table from here

    page = Page("Exit codes", "`hub.loop.EXIT_CODES`, the errors of `fleet.errors` and the parsers' own texts")
    page.para(
        "What `gridfleet` exits with. An error it raises on purpose is printed as one line (`gridfleet: error: "
        "...`) and exits with its class's code; a command line the parser refuses exits 2 with its usage; anything "
        "else that reaches the top is a bug, printed with its traceback (exit 1)."
    )
    page.heading(2, "Codes")
    codes_table(page)
    page.heading(2, "Errors and their codes")
    page.para("Each error class of `fleet.errors`; a subclass defined elsewhere exits with its parent's code.")
    rows = []
    for cls in errors():
        parent = next(b.__name__ for b in cls.__mro__[1:] if issubclass(b, Exception))
        rows.append(
            [code(cls.__name__), code(parent), code(cls.exit_code), text(first_paragraph(cls.__doc__), cell=True)]
        )
    page.table(["Error", "Is a", "Exit code", "What it means"], rows)
    page.heading(2, "What the commands say of their exit codes")
    said = []
    for cmd in walk(root):
        texts = [cmd.summary, cmd.parser.description or ""]
        if cmd.parser is not root:  # the root's epilog is the table above
            texts.append(cmd.parser.epilog or "")
        said += [[link(code(cmd.name), cmd.name, page="cli.md"), text(t, cell=True)] for t in exit_sentences(texts)]
    page.table(["Command", "Says"], said)
    return page.render()
