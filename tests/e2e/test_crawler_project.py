"""The team's crawler project on the embedded default: named in fleet.yaml, installed for the local nodes by
`run --local` (nothing by hand), run on every node, and a new version of it picked up by the next run."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import attempts
from tests.helpers.crawler_project import CRAWLER, make_project

pytestmark = pytest.mark.e2e

SITE = '  - {{id: shop-{n}, start_url: "{{demo}}/s/shop-{n}/?pages=2", crawler: "{crawler}"}}\n'
CONFIG = """\
run: {max_attempts: 2, hang_after_s: 15, heartbeat_timeout_s: 20, watch_interval_s: 2, deadline_s: 240}
fleet: {max_nodes: 2, sites_per_node: 2, idle_exit_s: 4}
hub: {port: 0}
crawlers: {project: ./team}
sites:
""" + "".join(SITE.format(n=n, crawler=CRAWLER) for n in range(4))


def test_the_teams_crawler_runs_on_every_local_node_and_its_next_version_on_the_next_run(gf):
    cfg = gf.write_config("fleet.yaml", CONFIG)
    hashes = []
    for run_id, release, version in (("v1", "r1", "1.0.0"), ("v2", "r2", "1.0.1")):
        make_project(gf.cwd / "team", release=release, version=version)
        p = gf.run("run", "--local", "--config", str(cfg), "--run-id", run_id, timeout=240)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        s = gf.summary(run_id)
        assert s["check"]["false_losses"] == 0, s["check"]["false_loss_details"]
        nodes = set()
        for n in range(4):
            [attempt] = attempts(s, f"shop-{n}")
            assert attempt["outcome"] == "completed"
            nodes.add(attempt["instance_id"])
            items = gf.result(run_id, f"shop-{n}")["items"]
            assert len(items) == 20 and {i["release"] for i in items} == {release}
        assert len(nodes) >= 2  # two sites per node: the project's crawler ran on each of them
        assert s["crawlers"]["name"] == "teamcrawlers" and s["crawlers"]["version"] == version
        hashes.append(s["crawlers"]["hash"])
    assert hashes[0] != hashes[1]
    installed = sorted(p.name for p in (gf.home / "local" / "crawlers").iterdir())
    assert installed == sorted(h.partition(":")[2][:12] for h in hashes)  # one install per version
