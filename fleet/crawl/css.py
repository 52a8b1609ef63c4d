"""CSS selectors parsed when the config loads, so that one the browser would refuse stops `gridfleet validate`.

The `links` crawler hands its selectors to the page (`querySelector`), where one that Chromium cannot parse fails
the crawl, and only after its first page has loaded. `selector_problem` parses each one before that with
soupsieve, Beautiful Soup's CSS selector engine (CSS Selectors level 4: `:is`, `:has`, `:nth-child(An+B of S)`),
so the config names every bad one. soupsieve is imported on the first check, not with this module: the Lambdas
load the config's models and never check a selector.

The two parsers do not agree on everything; where they differ, Chromium's reading wins as far as it is known:

- a pseudo-element (`::before`, `::part(x)`), which soupsieve does not implement, and a pseudo-class Chromium knows
  and soupsieve does not (`BROWSER_PSEUDO_CLASSES`, any `:-webkit-` or `:-internal-` one) are left to the browser:
  the rest of the selector is still parsed, the pseudo read as `:is(*)` (or, with an argument, as `:is(argument)`);
- soupsieve's own `:-soup-contains()` (or `:contains()`), which Chromium refuses, is refused;
- what soupsieve accepts and Chromium still refuses (a namespace prefix `ns|a`, `:matches()`, a few media
  pseudo-classes, anything after a pseudo-element) passes here and is refused by the crawl's own check on the
  page, which names the selector;
- a selector that ends inside a bracket or a string (`a[href`, `a[title="x]`, `:is(a`) is refused, though
  Chromium's error recovery closes what is open at the end: it is a typo far more often than it is meant; and so
  is an `:is()` or `:where()` list with an item neither knows, which Chromium drops (`:is(a, :foo)`), and a
  `:dir()` of anything but `ltr`, `rtl` or `auto`, which matches nothing in Chromium.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soupsieve.css_types import SelectorList

#: Pseudo-classes that Chromium accepts in `querySelector` and soupsieve does not know (Chromium 156, soupsieve
#: 2.10; tests/e2e/test_links_detail.py asks Chromium about each): form validity, dialogs, custom states, view
#: transitions, scroll markers and scrollbars, and the CSS2 pseudo-elements written with one colon.
BROWSER_PSEUDO_CLASSES = frozenset(
    {
        "valid",
        "invalid",
        "user-valid",
        "modal",
        "state",
        "xr-overlay",
        "active-view-transition",
        "active-view-transition-type",
        "interest-source",
        "interest-target",
        "navigation-source",
        "target-before",
        "target-after",
        "target-current",
        "window-inactive",
        "horizontal",
        "vertical",
        "decrement",
        "increment",
        "start",
        "end",
        "double-button",
        "single-button",
        "no-button",
        "corner-present",
        "before",
        "after",
        "first-line",
        "first-letter",
    }
)
_VENDOR_PREFIXES = ("-webkit-", "-internal-")

#: A pseudo-class or pseudo-element as soupsieve reports it: at its first colon, its name, and "(" if it has an
#: argument (soupsieve locates what it cannot read at that colon).
_PSEUDO = re.compile(r"(::?)(-?[A-Za-z_][-A-Za-z0-9_]*)(\(?)")
_UNKNOWN_PSEUDO = re.compile(r"'(:[^']*)' was detected as a pseudo-class")
_POSITION = re.compile(r",?\s+(?:at\s+)?position\s+\d+\b,?")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

#: Pseudos left to the browser in one selector at most: past that the selector is left to the browser whole.
_MAX_LEFT = 64


def _index(pattern: str, line: int, col: int) -> int:
    """The offset in `pattern` of soupsieve's (line, column), both counted from 1."""
    start = 0
    for n, brk in enumerate(_LINE_BREAK.finditer(pattern), start=2):
        if n > line:
            break
        start = brk.end()
    return start + col - 1


def _left_to_browser(name: str) -> bool:
    name = name.lower()
    return name in BROWSER_PSEUDO_CLASSES or name.startswith(_VENDOR_PREFIXES)


def _uses_contains(selectors: SelectorList) -> bool:
    """Whether a compiled selector holds soupsieve's `:-soup-contains()` anywhere (nested ones included)."""
    from soupsieve import css_types as ct

    todo = [selectors]
    while todo:
        for sel in todo.pop().selectors:
            if isinstance(sel, ct.SelectorNull):
                continue
            if sel.contains:
                return True
            todo += [*sel.selectors, sel.relation, *(nth.selectors for nth in sel.nth)]
    return False


def _message(error: Exception) -> str:
    """soupsieve's message as one line: its first (the others draw the selector), the position put in words."""
    head = str(error).splitlines()[0] if str(error) else type(error).__name__
    head = _POSITION.sub("", head.strip())
    unknown = _UNKNOWN_PSEUDO.match(head)
    if unknown:
        head = f"unknown pseudo-class '{unknown.group(1)}'"
    return head[:1].lower() + head[1:]


@functools.lru_cache(maxsize=4096)
def selector_problem(selector: str) -> str | None:
    """Why `selector` is not a CSS selector Chromium can use, or None if it is (or only the browser can tell)."""
    import soupsieve

    pattern = selector
    stood_in: list[tuple[int, int, int]] = []  # each pseudo left to the browser: (start, end of its stand-in, shift)

    def written(at: int) -> int:
        """An offset in `pattern` as an offset in `selector`."""
        for start, end, shift in reversed(stood_in):
            at = at - shift if at >= end else min(at, start)
        return at

    for _ in range(_MAX_LEFT):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # soupsieve warns of `:contains`, refused below anyway
                compiled: Any = soupsieve.compile(pattern)
        except soupsieve.SelectorSyntaxError as e:
            message = _message(e)
            at = _index(pattern, e.line, e.col) if e.line is not None and e.col is not None else None
            pseudo = _PSEUDO.match(pattern, at) if at is not None and message.startswith("unknown") else None
            if pseudo is None or not _left_to_browser(pseudo.group(2)):
                return message if at is None else f"{message} at character {written(at) + 1}"
        except NotImplementedError as e:  # a pseudo-element (or an at-rule): "... found at position N"
            found = re.search(r"position (\d+)", str(e))
            pseudo = _PSEUDO.match(pattern, int(found.group(1))) if found else None
            if pseudo is None or pseudo.group(1) != "::":
                return _message(e)
        except RecursionError:
            return "nested too deeply"
        except ValueError as e:  # past one of soupsieve's own bounds
            return _message(e)
        else:
            if _uses_contains(compiled.selectors):
                return "':-soup-contains()' is soupsieve's own pseudo-class: Chromium refuses it"
            return None
        stand_in = ":is(" if pseudo.group(3) else ":is(*)"
        pattern = pattern[: pseudo.start()] + stand_in + pattern[pseudo.end() :]
        stood_in.append((pseudo.start(), pseudo.start() + len(stand_in), len(stand_in) - len(pseudo.group(0))))
    return None
