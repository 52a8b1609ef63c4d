"""The docs site: Sphinx, its pages in Markdown (MyST), the furo theme. `make docs` builds it into docs/_build/html.

Built with warnings as errors (`-W --keep-going`), so a link to a page or a heading that does not exist fails the
build. Nothing here fetches anything: the search is Sphinx's own, from the built searchindex.js.
"""

from __future__ import annotations

from importlib.metadata import version as _installed

project = "gridfleet"
release = version = _installed("gridfleet")

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# docs/ARCHITECTURE.md is kept for the links that name it; it only says where each of its sections now lives.
exclude_patterns = ["_build", "ARCHITECTURE.md"]

# Markdown links to a heading of a page (`[text](../guide/fleet-yaml.md#notable-keys)`) resolve for headings down
# to level 3, by the slugs GitHub gives them, so the same links work where GitHub renders the .md files.
myst_heading_anchors = 3
# Code blocks without a language are shown as they are (a file tree, a command's output), not read as Python.
highlight_language = "text"

html_theme = "furo"
html_title = "gridfleet"
html_static_path: list[str] = []
html_show_sourcelink = False
html_show_copyright = False
# `--failed` and `--upload` in prose stay two hyphens (options are copied from these pages), not an en dash.
smartquotes = False
