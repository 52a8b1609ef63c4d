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
