"""The docs site (docs/, `make docs`) builds with every warning an error, and every link inside it leads somewhere:
each relative href or src of the built HTML names a file of the site and, with a #fragment, an element of that
file with that id. Links out of the site are listed, never requested. README.md stays short (at most 200 lines),
and its relative links, like those of docs/ARCHITECTURE.md (which GitHub shows but the site leaves out), name files
that exist and headings those files have, by the slugs MyST gives headings.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from myst_parser.slugs import github_slugify, unique_slug

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 200
#: Markdown files outside the site whose links point into it.
LINKING_IN = (README, DOCS / "ARCHITECTURE.md")

#: Attributes that load or lead to another document: (tag, attribute).
LINK_ATTRS = {("a", "href"), ("link", "href"), ("img", "src"), ("script", "src"), ("iframe", "src"), ("source", "src")}
#: Of those, the ones the browser fetches by itself to show the page (the rest are followed only when clicked).
RESOURCE_ATTRS = LINK_ATTRS - {("a", "href")}


def build_site(out: Path) -> Path:
    """Builds docs/ into `out` as `make docs` does (warnings as errors); fails the test with Sphinx's warnings."""
    doctrees = out.parent / "doctrees"
    argv = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(doctrees)]
    proc = subprocess.run([*argv, str(DOCS), str(out)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"the docs site does not build (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return out


@dataclass
class Page:
    """What one built HTML file holds: the ids a fragment can name, and its links as (tag, attribute, value)."""

    ids: set[str] = field(default_factory=set)
    links: list[tuple[str, str, str]] = field(default_factory=list)


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.page.ids.add(value)
            if (tag, name) in LINK_ATTRS:
                self.page.links.append((tag, name, value))


def read_page(path: Path) -> Page:
    parser = _PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser.page


def is_external(url: str) -> bool:
    """A link with a scheme (https:, mailto:, ...) or a host of its own (//host/...) leaves the site."""
    parts = urlsplit(url)
    return bool(parts.scheme or parts.netloc)


@dataclass
class LinkReport:
    broken: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    external_resources: list[str] = field(default_factory=list)


def check_links(site: Path) -> LinkReport:
    """Every link of every HTML file under `site`: the relative ones must resolve to a file of the site (and the
    fragment to an id in it); the external ones are collected, never requested."""
    site = site.resolve()
    pages = {path: read_page(path) for path in sorted(site.rglob("*.html"))}
    report = LinkReport()
    for path, page in pages.items():
        where = path.relative_to(site).as_posix()
        for tag, attr, url in page.links:
            if is_external(url):
                report.external.append(f"{where}: {url}")
                if (tag, attr) in RESOURCE_ATTRS:
                    report.external_resources.append(f"{where}: <{tag} {attr}={url!r}>")
                continue
            parts = urlsplit(url)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.is_relative_to(site) or not target.is_file():
                report.broken.append(f"{where}: {url}: no file {target}")
                continue
            fragment = unquote(parts.fragment)
            if not fragment:
                continue
            held = pages.get(target)
            if held is None:
                report.broken.append(f"{where}: {url}: #{fragment} names an element of a file that is not a page")
            elif fragment not in held.ids:
                report.broken.append(f"{where}: {url}: no element with id {fragment!r} in {target.name}")
    return report


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(tmp_path_factory.mktemp("docs-site") / "html")


def test_every_page_of_docs_is_built(site):
    """Every Markdown page of docs/ becomes a page of the site (with -W, one no toctree reaches fails the build)."""
    sources = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md") if "_build" not in p.parts}
    sources.discard("ARCHITECTURE")  # left out of the site: it says where each of its sections went
    missing = sorted(s for s in sources if not (site / f"{s}.html").is_file())
    assert not missing
    assert (site / "search.html").is_file() and (site / "searchindex.js").is_file()


def test_every_internal_link_of_the_built_site_resolves(site):
    report = check_links(site)
    assert not report.broken, "\n".join(report.broken)


def test_links_out_of_the_site_are_only_listed_and_nothing_is_loaded_from_elsewhere(site):
    """The site works offline: no stylesheet, script or image comes from another host. Links to other sites are
    listed here (and printed with -s), never requested."""
    report = check_links(site)
    print("\n".join(["links out of the site (not requested):", *report.external]))
    assert not report.external_resources, "\n".join(report.external_resources)
    assert all(urlsplit(line.split(": ", 1)[1]).scheme in {"http", "https", "mailto"} for line in report.external)


def test_the_link_check_finds_a_missing_file_a_missing_id_and_a_link_that_leaves_the_site(tmp_path):
    (tmp_path / "guide").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="guide/page.html#there">ok</a> <a href="guide/page.html#nowhere">bad id</a>'
        ' <a href="gone.html">bad file</a> <a href="#top" id="top">self</a> <a href="https://example.org/">out</a>'
        ' <script src="https://cdn.example.org/x.js"></script> <a href="../outside.html">outside</a>'
    )
    (tmp_path / "guide" / "page.html").write_text('<h2 id="there">There</h2> <img src="../index.html">')
    (tmp_path.parent / "outside.html").write_text("outside the site")
    report = check_links(tmp_path)
    assert [line.split(":")[1].strip() for line in report.broken] == [
        "guide/page.html#nowhere",
        "gone.html",
        "../outside.html",
    ]
    assert report.external == ["index.html: https://example.org/", "index.html: https://cdn.example.org/x.js"]
    assert report.external_resources == ["index.html: <script src='https://cdn.example.org/x.js'>"]


# --- README.md and the Markdown files that link into the site -------------------------------------------------


def heading_anchors() -> int:
    """The deepest heading level MyST gives an anchor to, as docs/conf.py sets it."""
    return int(runpy.run_path(str(DOCS / "conf.py"))["myst_heading_anchors"])


def markdown_anchors(path: Path, depth: int) -> set[str]:
    """The anchors of a Markdown file's headings, made as MyST makes them: the heading's text and inline code,
    GitHub's slug of it, `-1`, `-2`, ... after a slug already taken."""
    tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))
    slugs: set[str] = set()
    for opening, inline in zip(tokens, tokens[1:], strict=False):
        if opening.type != "heading_open" or int(opening.tag[1:]) > depth:
            continue
        title = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
        slug = github_slugify(title)
        if slug:
            slugs.add(unique_slug(slug, slugs))
    return slugs


def markdown_links(path: Path) -> list[str]:
    tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))
    return [
        str(child.attrs["href"])
        for token in tokens
        if token.type == "inline"
        for child in token.children or []
        if child.type == "link_open"
    ]


def broken_relative_links(path: Path, depth: int) -> list[str]:
    broken = []
    for url in markdown_links(path):
        if is_external(url):
            continue
        parts = urlsplit(url)
        target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not target.exists():
            broken.append(f"{url}: no such file")
        elif parts.fragment and target.suffix == ".md" and parts.fragment not in markdown_anchors(target, depth):
            broken.append(f"{url}: {target.name} has no heading with the anchor #{parts.fragment}")
    return broken


def test_the_readme_is_at_most_200_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in the docs site (docs/)"


@pytest.mark.parametrize("path", LINKING_IN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_of_a_markdown_file_outside_the_site_resolves(path):
    assert markdown_links(path), f"{path.name} links nowhere into the docs"
    broken = broken_relative_links(path, heading_anchors())
    assert not broken, "\n".join(broken)


def test_the_markdown_link_check_knows_a_heading_from_a_missing_one(tmp_path):
    (tmp_path / "page.md").write_text("# The `links` crawler: fields\n\n## Notes\n\n## Notes\n\n#### Too deep\n")
    (tmp_path / "README.md").write_text(
        "[a](page.md#the-links-crawler-fields) [b](page.md#notes-1) [c](page.md#too-deep) [d](page.md#nothing)"
        " [e](gone.md) [f](https://example.org/#x)\n"
    )
    assert broken_relative_links(tmp_path / "README.md", depth=3) == [
        "page.md#too-deep: page.md has no heading with the anchor #too-deep",
        "page.md#nothing: page.md has no heading with the anchor #nothing",
        "gone.md: no such file",
    ]
