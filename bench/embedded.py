"""Benchmark: `gridfleet run --local` against a plain sequential Selenium loop, measured side by side.

Both crawl the same N demo sites (P pages each, D seconds of server delay per
page) on one local stack: gridfleet with K nodes through the Selenium Grid,
the baseline with one Chromium visiting every page in turn. Prints both wall
times and their ratio; each site's phases on its node (mean and p95, from the
nodes' `completed` log lines); a bare browser start (chromedriver and Chromium
with the crawl's arguments, no Grid, one at a time); and the overhead per site:
what a node spends on a site beyond its pages and that bare browser start,
beside the sequential loop's time per site beyond the server's delays.

    .venv/bin/python bench/embedded.py --sites 12 --nodes 4 --pages 3 --delay 2
    .venv/bin/python bench/embedded.py ... --browser /usr/lib/chromium/chromium-headless-shell
    .venv/bin/python bench/embedded.py ... --code ../other-checkout   # the fleet runs that checkout's code
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.phases import bare_starts, p95, phase_table, site_phases  # noqa: E402
from node.browser import BASE_ARGS, STARTUP_PREFS  # noqa: E402


def gridfleet(env: dict, cwd: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def sequential(urls: list[str], pages: int, profile: Path) -> tuple[float, int]:
    """One browser, every site in turn, following `a.next` like the links crawler; (wall s, items)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in BASE_ARGS + (("--no-sandbox",) if os.geteuid() == 0 else ()):
        opts.add_argument(a)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_experimental_option("prefs", STARTUP_PREFS)
    start = time.monotonic()
    driver = webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))
    items = 0
    try:
        for url in urls:
            for _ in range(pages):
                driver.get(url)
                items += len(driver.find_elements("css selector", "a.item"))
                nxt = driver.find_elements("css selector", "a.next")
                if not nxt:
                    break
                url = nxt[0].get_attribute("href")
    finally:
        driver.quit()
    return time.monotonic() - start, items


def options() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--pages", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.3, help="server delay per page, seconds")
    ap.add_argument("--browser", default="/usr/bin/chromium", help="browser.chromium of the fleet's crawls")
    ap.add_argument("--code", type=Path, help="run the fleet from this checkout (PYTHONPATH) instead of this one")
    ap.add_argument("--bare", type=int, default=4, help="bare browser starts to measure")
    return ap.parse_args()


def fleet_config(work: Path, names: list[str], args: argparse.Namespace) -> Path:
    cfg = work / "bench.yaml"
    lines = [
        "run: {hang_after_s: 60, watch_interval_s: 1, deadline_s: 3600}",
        f"fleet: {{max_nodes: {args.nodes}, idle_exit_s: 5}}",
        f"browser: {{chromium: {json.dumps(args.browser)}}}",
        "sites:",
    ]
    lines += [f'  - {{id: {n}, start_url: "{{demo}}/s/{n}/?pages={args.pages}&delay_s={args.delay}"}}' for n in names]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def main() -> int:
    args = options()
    work = Path(tempfile.mkdtemp(prefix="gridfleet-bench-"))
    env = {**os.environ, "GRIDFLEET_HOME": str(work / "home")}
    if args.code:
        env["PYTHONPATH"] = str(args.code.resolve())
    tag = uuid.uuid4().hex[:6]
    names = [f"b{tag}-{i:03d}" for i in range(args.sites)]
    cfg = fleet_config(work, names, args)
    up = gridfleet(env, work, "local", "up", timeout=180)
    if up.returncode != 0:
        print(up.stdout + up.stderr, file=sys.stderr)
        return 1
    try:
        demo = json.loads((work / "home" / "local" / "stack.json").read_text())["components"]["demo"]["url"]
        t0 = time.monotonic()
        run = gridfleet(env, work, "run", "--local", "--config", str(cfg), "--run-id", f"bench-{tag}")
        wall_fleet = time.monotonic() - t0
        if run.returncode != 0:
            print(run.stdout + run.stderr, file=sys.stderr)
            return 1
        run_dir = work / "runs" / f"bench-{tag}"
        summary = json.loads((run_dir / "summary.json").read_text())
        durations = [
            a["end"] - a["start"]
            for s in summary["sites"].values()
            for a in s["attempts"]
            if a["outcome"] == "completed"
        ]
        bare = bare_starts(args.browser, "/usr/bin/chromedriver", args.bare, work)
        bare_together = bare_starts(args.browser, "/usr/bin/chromedriver", 2, work, at_once=args.nodes)
        urls = [f"{demo}/s/{n}/?pages={args.pages}&delay_s={args.delay}" for n in names]
        wall_seq, items = sequential(urls, args.pages, work / "seq-profile")
    finally:
        gridfleet(env, work, "local", "down", timeout=120)
    report(args, summary, wall_fleet, wall_seq, items, durations, site_phases(run_dir), bare, bare_together)
    return 0


def report(args, summary, wall_fleet, wall_seq, items, durations, rows, bare, together) -> None:
    served = args.pages * args.delay  # what the server itself spends on one site
    over_seq = wall_seq / args.sites - served
    print(f"sites={args.sites} nodes={args.nodes} pages/site={args.pages} server delay/page={args.delay}s")
    print(f"browser: {args.browser}" + (f"; fleet code from {args.code}" if args.code else ""))
    print(
        f"gridfleet run --local : {wall_fleet:7.1f} s wall (incl. {summary['nodes']['launched']} node boots, teardown)"
    )
    print(f"sequential Selenium   : {wall_seq:7.1f} s wall ({items} items)")
    print(f"ratio sequential/gridfleet = {wall_seq / wall_fleet:.2f}x")
    print()
    print("per site on its node:")
    print("\n".join(phase_table(rows)))
    bare_mean, together_mean = statistics.mean(bare), statistics.mean(together)
    print(
        f"bare browser start (chromedriver + browser, no Grid): one at a time mean {bare_mean:.2f} s; "
        f"{args.nodes} at once (as the nodes start theirs) mean {together_mean:.2f} s"
    )
    print()
    over_fleet = [d - served for d in durations]
    print(
        f"attempt time - server delay (claim to COMPLETED): gridfleet mean {statistics.mean(over_fleet):.2f} s, "
        f"p95 {p95(over_fleet):.2f} s; sequential loop {over_seq:.2f} s"
    )
    own = [r["busy_s"] - r["crawl_s"] - r["request_s"] for r in rows if {"busy_s", "crawl_s", "request_s"} <= set(r)]
    if own:
        print(
            f"the node's own work per site (node busy - pages - Grid session request): mean "
            f"{statistics.mean(own):.2f} s, p95 {p95(own):.2f} s"
        )
    for label, start in (("one at a time", bare_mean), (f"{args.nodes} at once", together_mean)):
        beyond = [r["busy_s"] - r["crawl_s"] - start for r in rows if "busy_s" in r and "crawl_s" in r]
        if beyond:
            print(
                f"overhead per site (node busy - pages - bare start {label}): gridfleet mean "
                f"{statistics.mean(beyond):.2f} s, p95 {p95(beyond):.2f} s; "
                f"sequential loop (time per site - server delay) {over_seq:.2f} s"
            )


if __name__ == "__main__":
    raise SystemExit(main())
