"""A team's crawler project, written into a test's directory: a pyproject.toml project with one BaseCrawler
subclass that crawls the demo server's plain /s/ sites and stamps each item with its `release` (so a test sees
which version of the code produced a result)."""

from __future__ import annotations

import textwrap
from pathlib import Path

CRAWLER = "teamcrawlers.shop:ShopCrawler"


def make_project(root: Path, release: str = "r1", version: str = "1.0.0", dependencies: str = "[]") -> Path:
    (root / "teamcrawlers").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "teamcrawlers"
            version = "{version}"
            dependencies = {dependencies}

            [tool.setuptools]
            packages = ["teamcrawlers"]
            """
        )
    )
    (root / "teamcrawlers" / "__init__.py").write_text('"""The team\'s site crawlers."""\n')
    (root / "teamcrawlers" / "shop.py").write_text(
        textwrap.dedent(
            f"""\
            from node.crawler import BaseCrawler

            RELEASE = "{release}"


            class ShopCrawler(BaseCrawler):
                def crawl(self):
                    url = self.ctx.start_url
                    while url:
                        self.open(url)
                        for a in self.driver.find_elements("css selector", "a.item"):
                            yield {{"id": a.get_attribute("data-id"), "release": RELEASE}}
                        nxt = self.driver.find_elements("css selector", "a.next")
                        url = nxt[0].get_attribute("href") if nxt else None
            """
        )
    )
    return root


def make_wheel(into: Path, name: str, version: str, requires: tuple[str, ...] = (), code: str = "") -> Path:
    """A pure-Python wheel of one module `name` (its code `code`) that requires `requires`, written by hand into
    `into`: a package index for pip (`PIP_FIND_LINKS` with `PIP_NO_INDEX`) that needs no network."""
    import zipfile

    into.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": code or f'VERSION = "{version}"\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gridfleet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    path = into / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
    return path
