"""The reference pages of the docs, generated from the code: written into docs/reference/, checked in.

    .venv/bin/python scripts/docs_reference.py           write every page
    .venv/bin/python scripts/docs_reference.py --check   exit 1 naming each page that differs from the code's

The pages are the command line (`cli.main.build_parser()`), the exit codes, every key of fleet.yaml (the models
of `fleet.config`), the failure classes and their retries, the shapes of summary.json and result.json, and the
metrics; index.md lists them. Exit 0 when every page is written or matches; 1 when one differs; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference"
sys.path[:0] = [str(ROOT)] if str(ROOT) not in sys.path else []

from reference_pages import cli_page, config_page, exits_page, metrics_page, records_page  # noqa: E402
from reference_pages.markdown import COMMAND, Page, text  # noqa: E402


@dataclass(frozen=True)
class Reference:
    file: str
    title: str
    what: str
    render: Callable[[], str]


def _parser() -> argparse.ArgumentParser:
    from cli.main import build_parser

    return build_parser()


PAGES = (
    Reference(
        "cli.md", "Command line", "every command, option, default and exit code", lambda: cli_page.render(_parser())
    ),
    Reference(
        "exit-codes.md", "Exit codes", "what `gridfleet` exits with, and why", lambda: exits_page.render(_parser())
    ),
    Reference("fleet-yaml.md", "fleet.yaml", "every key: its type, default and meaning", config_page.render),
    Reference(
        "failures.md", "Failure classes and retries", "why attempts fail and what follows", records_page.failures_page
    ),
    Reference(
        "summary.md", "summary.json and result.json", "what a run leaves behind, key by key", records_page.summary_page
    ),
    Reference("metrics.md", "Metrics", "the Prometheus families and CloudWatch metrics", metrics_page.render),
)


def index() -> str:
    page = Page("Reference", "the list of pages in `scripts/docs_reference.py`")
    page.para(
        text(
            "Every page here is written from the code by a script and checked in; a test fails when a page and the "
            f"code differ (run `{COMMAND}` to write them again)."
        )
    )
    page.table(
        ["Page", "What it holds"], [[f"[{text(p.title, cell=True)}]({p.file})", text(p.what, cell=True)] for p in PAGES]
    )
    page.code_block(":maxdepth: 1\n\n" + "\n".join(p.file.removesuffix(".md") for p in PAGES), "{toctree}")
    return page.render()


def pages() -> dict[str, str]:
    """Each page's file name and the text the code gives it now."""
    return {"index.md": index(), **{p.file: p.render() for p in PAGES}}


def differing(out: Path | None = None) -> list[str]:
    """The pages whose file under `out` (default docs/reference) is missing or is not what the code gives."""
    out = OUT if out is None else out
    return [
        name
        for name, body in pages().items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != body
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="docs_reference.py", description="Write (or --check) docs/reference/.")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each page that differs")
    args = ap.parse_args(argv)
    if args.check:
        stale = differing()
        for name in stale:
            print(f"docs/reference/{name} differs from what the code gives")
        if stale:
            print(f"run `{COMMAND}` to write the reference pages again")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, body in pages().items():
        path = OUT / name
        if not path.is_file() or path.read_text(encoding="utf-8") != body:
            path.write_text(body, encoding="utf-8")
            print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
