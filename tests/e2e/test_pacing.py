"""Per-domain pacing on the embedded default: two sites on the demo server reached as localhost, whose robots.txt
says Crawl-delay: 1, crawled by two nodes at once, checked from the server's own arrival times (`/_stats`) and
shown in the run's summary and report."""

from __future__ import annotations

from itertools import pairwise
from urllib.parse import urlsplit

import pytest

from embedded.demo_server import LOCALHOST_CRAWL_DELAY_S
from fleet.aws.ratelimit import PACE_MARGIN
from tests.e2e.conftest import attempts

pytestmark = pytest.mark.e2e

CONFIG = """\
run: {max_attempts: 2, hang_after_s: 8, heartbeat_timeout_s: 15, watch_interval_s: 2, deadline_s: 240}
fleet: {max_nodes: 2, idle_exit_s: 5}
hub: {port: 0}
sites:
  - {id: paced-a, start_url: "{demo-localhost}/s/paced-a/?pages=3"}
  - {id: paced-b, start_url: "{demo-localhost}/s/paced-b/?pages=3"}
"""


def test_two_nodes_keep_to_the_crawl_delay_of_one_domain_together(gf):
    assert gf.run("local", "up", timeout=120).returncode == 0
    cfg = gf.write_config("paced.yaml", CONFIG)
    run = gf.run("run", "--local", "--config", str(cfg), "--run-id", "paced", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    s = gf.summary("paced")
    assert all(site["run_status"] == "COMPLETED" for site in s["sites"].values())
    nodes = {attempts(s, name)[0]["instance_id"] for name in ("paced-a", "paced-b")}

    stats = gf.demo_stats()
    times = sorted(t for name in ("paced-a", "paced-b") for t in stats[name]["times"])
    assert len(times) == 6
    gaps = [b - a for a, b in pairwise(times)]
    print(f"paced: 6 requests from {len(nodes)} nodes, gaps {[round(g, 2) for g in gaps]}")
    # Both nodes' requests together, a Crawl-delay apart. Each request leaves at its slot; the server sees it when
    # it arrives, and on a busy machine one that arrives late shortens the next gap (0.77 s seen): the span holds
    # every slot, and no gap comes near what two unpaced nodes would make (both at once).
    assert times[-1] - times[0] >= 0.9 * len(gaps) * LOCALHOST_CRAWL_DELAY_S, gaps
    assert min(gaps) >= 0.5 * LOCALHOST_CRAWL_DELAY_S, gaps

    domain = f"localhost:{urlsplit(gf.demo_url()).port}"
    pace = s["pacing"][domain]
    spaced = PACE_MARGIN * LOCALHOST_CRAWL_DELAY_S
    assert pace == {"requests": 6, "base_s": spaced, "base_from": "crawl-delay", "backoffs": 0, "spacing_s": spaced}
    report = gf.run("report", "--run-id", "paced")
    assert report.returncode == 0, report.stderr
    html = (gf.cwd / "runs" / "paced" / "report.html").read_text()
    assert f'<tr><td>{domain}</td><td class="num">6</td><td class="num">{spaced:g} s</td><td>crawl-delay</td>' in html
