"""MyST Markdown as the reference pages write it: escaped text, code spans, pipe tables, and a page whose headings
never skip a level and never share an anchor (the slugs MyST gives them, GitHub's)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

#: The script that writes the pages, as every page names it.
COMMAND = ".venv/bin/python scripts/docs_reference.py"

#: Characters escaped in text (not in code spans): emphasis, raw HTML, links, table cells, MyST roles and
#: attributes, math, substitutions, strikethrough, entities.
_SPECIAL = re.compile(r"([\\`*_<>\[\]|$~{}&#])")
#: A code span as help texts and docstrings write them: a run of backticks, then the same run again.
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
_SLUG_DROP = re.compile(r"[^\w\u4e00-\u9fff\- ]")


def one_line(text: str) -> str:
    """`text` with every run of whitespace, newlines included, made one space."""
    return " ".join(text.split())


def text(value: str, *, cell: bool = False) -> str:
    """Prose as Markdown: its code spans kept (a `|` in one escaped in a table cell), everything else escaped."""
    out: list[str] = []
    rest = one_line(value)
    while rest:
        m = _CODE_SPAN.search(rest)
        plain, span = (rest, "") if m is None else (rest[: m.start()], m.group(0))
        out.append(_SPECIAL.sub(r"\\\1", plain))
        out.append(span.replace("|", r"\|") if cell else span)
        rest = "" if m is None else rest[m.end() :]
    return "".join(out)


def code(value: object, *, cell: bool = False) -> str:
    """`value` as one code span, its fence longer than any run of backticks in it."""
    s = one_line(str(value))
    if not s:
        return ""
    fence = "`" * (max((len(r) for r in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    body = s.replace("|", r"\|") if cell else s
    return f"{fence}{pad}{body}{pad}{fence}"


def codes(values: Iterable[object]) -> str:
    """Values as code spans, comma separated, for a table cell."""
    return ", ".join(code(v, cell=True) for v in values)


def first_paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line ("" for none)."""
    return one_line((doc or "").strip().split("\n\n")[0])


def slug(title: str) -> str:
    """The anchor MyST (`myst_heading_anchors`) and GitHub give a heading whose text is `title`."""
    return _SLUG_DROP.sub("", title.lower().replace(" ", "-"))


def link(label: str, anchor_title: str, page: str = "") -> str:
    """A link, its label Markdown already escaped (`text`, `code`), to the heading whose text is `anchor_title` on
    this page, or on `page` (a file beside it)."""
    return f"[{label}]({page}#{slug(anchor_title)})"


class Page:
    """One page: an H1 and the line that says where it comes from, then headings, paragraphs, tables and code
    blocks, in order. A heading that skips a level or repeats an anchor raises (a stable anchor per heading)."""

    def __init__(self, title: str, source: str):
        self._blocks: list[str] = [f"# {text(title)}", f"Generated from {source} by `{COMMAND}`: do not edit by hand."]
        self._slugs: set[str] = {slug(title)}
        self._level = 1

    def heading(self, level: int, title: str, *, as_code: bool = False) -> None:
        """A heading of `level` (2 or more); `as_code`: its text is one code span (a key, a command)."""
        if not 2 <= level <= self._level + 1:
            raise ValueError(f"heading {title!r}: level {level} after level {self._level}")
        anchor = slug(title)
        if anchor in self._slugs:
            raise ValueError(f"heading {title!r}: its anchor #{anchor} is taken on this page")
        self._slugs.add(anchor)
        self._level = level
        self._blocks.append(f"{'#' * level} {code(title) if as_code else text(title)}")

    def para(self, markdown: str) -> None:
        """A paragraph of Markdown already escaped (`text`, `code`, `link`)."""
        if markdown.strip():
            self._blocks.append(markdown.strip())

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        """A pipe table; each cell is Markdown already escaped for a cell (one line, `|` escaped)."""
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
        for row in rows:
            if len(row) != len(headers):
                raise ValueError(f"a row of {len(row)} cells under {len(headers)} headers: {row!r}")
            if any("\n" in c for c in row):
                raise ValueError(f"a cell holds a newline: {row!r}")
            lines.append("| " + " | ".join(row) + " |")
        self._blocks.append("\n".join(lines))

    def code_block(self, body: str, language: str = "text") -> None:
        fence = "`" * max(3, max((len(r) + 1 for r in re.findall(r"`{3,}", body)), default=3))
        self._blocks.append(f"{fence}{language}\n{body.rstrip()}\n{fence}")

    def render(self) -> str:
        return "\n\n".join(self._blocks) + "\n"
