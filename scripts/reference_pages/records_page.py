"""failures.md, from `fleet.record.failures` (the classes, and the retry policy with `run.retry` unset) and the
reasons of `fleet.record.state`; summary.md, from the shapes of `fleet.outputs.shapes` and `node.result`."""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from collections.abc import Iterator, Mapping
from enum import StrEnum

from fleet.outputs.shapes import SUMMARY, Key
from fleet.record import failures
from fleet.record.failures import Failure, FailureClass, RetryPolicy, RetryRule, of_reason, of_status
from fleet.record.state import GIVEN_BACK, Reason
from node.result import RESULT
from reference_pages.markdown import Page, code, codes, first_paragraph, link, one_line, text


def member_comments(enum: type[StrEnum]) -> dict[str, str]:
    """The comment on the line of each member of `enum` (`HANG = "hang"  # ...`), by value."""
    source = inspect.getsource(enum)
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    out: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            member = enum[node.targets[0].id]
            out[member.value] = comments.get(node.lineno, "")
    return out


def rule_cells(rule: RetryRule) -> list[str]:
    if not rule.retry:
        return ["fail", "", "", "", ""]
    return [
        "retry",
        code(f"{rule.backoff_s:g}"),
        code(f"{rule.factor:g}"),
        code(f"{rule.max_s:g}"),
        "yes" if rule.other_node else "",
    ]


RULE_HEADERS = ["Retry", "First wait (s)", "Factor", "Longest wait (s)", "On another node"]


def status_keys() -> list[int]:
    """The HTTP statuses with a rule of their own by default (`http_404`)."""
    return sorted(int(k[5:]) for k in failures.DEFAULT_RULES if k[5:].isdigit())


def failures_page() -> str:
    policy = RetryPolicy()
    page = Page(
        "Failure classes and retries",
        "`fleet.record.failures` (`FailureClass`, `DEFAULT_RULES`, `RetryRule`) and `fleet.record.state.Reason`",
    )
    page.para(text((failures.__doc__ or "").strip().split("\n\n")[1]))  # how a failure gets its class
    page.para(
        "The tables give the rules with `run.retry` unset; "
        + link(code("run.retry"), "run.retry.<key>", page="fleet-yaml.md")
        + " sets any of them, by class or by one status. A retry happens only while the site has attempts left "
        "(`run.max_attempts`)."
    )
    page.para(
        text(
            one_line(RetryRule.__doc__ or "")
            + " After the site's nth failed attempt the wait is `backoff_s * factor ** (n - 1)`, at most `max_s`; a "
            "`Retry-After` the site gave replaces it, within `max_s` (`RetryRule.delay`)."
        )
    )
    page.heading(2, "Classes")
    comments = member_comments(FailureClass)
    page.table(
        ["Class", "What failed", *RULE_HEADERS],
        [
            [code(c.value), text(comments[c.value], cell=True), *rule_cells(policy.rule(Failure(c)))]
            for c in FailureClass
        ],
    )
    page.heading(2, "Rules by HTTP status")
    page.para("A status with a rule of its own (its key is `http_<status>`) takes it over its class's.")
    rows = []
    for status in status_keys():
        failure = of_status(status)
        assert failure is not None
        rows.append([code(failure.key), code(failure.cls.value), *rule_cells(policy.rule(failure))])
    page.table(["Key", "Class", *RULE_HEADERS], rows)
    page.heading(2, "Why an attempt ended")
    page.para(
        text(first_paragraph(Reason.__doc__))
        + " *Class*: the class an attempt that ended so has when its node named none; a reason without one is the "
        "fleet's, not the site's failure. A given-back attempt is not counted against `run.max_attempts`, up to "
        "`run.spot_requeue_cap` of them."
    )
    reasons = member_comments(Reason)
    rows = []
    for r in Reason:
        f = of_reason(r)
        rows.append(
            [
                code(r.value),
                text(reasons[r.value], cell=True),
                code(f.cls.value) if f else "",
                "yes" if r in GIVEN_BACK else "",
            ]
        )
    page.table(["Reason", "What happened", "Class", "Given back"], rows)
    return page.render()


# --- summary.md ----------------------------------------------------------------------------------------------------
def inner(full: str, key: Key) -> tuple[str, Key]:
    """Where the object a key holds sits (through arrays and maps: `sites.<site id>`), and its Key."""
    here = full
    while key.each is not None and key.keys is None:
        here += "[]" if key.type == "array" else f".<{key.named}>"
        key = key.each
    return here, key


def objects(shape: Mapping[str, Key], path: str) -> Iterator[tuple[str, Mapping[str, Key]]]:
    """(path, keys) of the object at `path` and of every object with keys of its own under it, depth first."""
    yield path, shape
    for name, key in shape.items():
        here, value = inner(f"{path}.{name}" if path else name, key)
        if value.keys is not None:
            yield from objects(value.keys, here)


def key_type(key: Key) -> str:
    """The type as written, with what an array holds or a map maps to."""
    if key.each is None:
        return key.type
    of = key_type(key.each)
    return f"array of {of}" if key.type == "array" else f"object: {key.named} to {of}"


def key_rows(title: str, path: str, keys: Mapping[str, Key]) -> Iterator[list[str]]:
    """One row per key of the object at `path`; a key whose value has keys of its own links to their table."""
    for name, key in keys.items():
        meaning = text(key.meaning, cell=True)
        if key.values:
            meaning += f" (one of {codes(key.values)})"
        full = f"{path}.{name}" if path else name
        kind = text(key_type(key), cell=True)
        here, value = inner(full, key)
        if value.keys is not None:
            kind += ": " + link("keys", f"{title}: {here}")
        yield [code(full, cell=True), kind, text(key.when or "always", cell=True), meaning]


def document(page: Page, title: str, shape: Mapping[str, Key]) -> None:
    page.heading(2, title, as_code=True)
    for path, keys in objects(shape, ""):
        if path:
            page.heading(3, f"{title}: {path}")
        page.table(["Key", "Type", "There", "Meaning"], key_rows(title, path, keys))


def summary_page() -> str:
    page = Page(
        "summary.json and result.json",
        "`fleet.outputs.shapes.SUMMARY` and `node.result.RESULT`, the shapes the writers are tested against",
    )
    page.para(
        text(
            "What a run leaves behind, key by key: `runs/<run_id>/summary.json`, and each COMPLETED site's result, "
            "`<site>/<YYYYMMDD>[/<run_id>]/result.json` in the bucket and `runs/<run_id>/results/<site>.json` once "
            "exported. Times are epoch seconds. A key that is not there always is left out when it does not apply. "
            "`[]` marks an array's items, `<...>` a map's keys."
        )
    )
    document(page, "summary.json", SUMMARY)
    document(page, "result.json", RESULT)
    return page.render()
