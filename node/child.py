"""The crawler process: runs one crawl and reports to the agent over a pipe.

`python -m node.child --event-fd N` reads the job (JSON) on stdin and writes one
JSON event per line to fd N: `status`, `session`, then `result` or `error`. It
runs in its own process group, so the agent, the hub or an SSM/SSH command can
end a hung crawl with one signal. After an error it leaves its browser open: the
agent reads the browser's evidence (`node.evidence`), then closes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.grid_auth import GridSecret
from fleet.record.failures import Failure, FailureClass, failure_to_event, of_exception
from node.crawler import CrawlContext, CrawlError, RobotsDenied
from node.pacing import Pacer
from node.registry import load_crawler


def group_pacer(spec: dict[str, Any] | None) -> Callable[[], None] | None:
    """Waits for the next slot of the site's fleet-wide rate limit group, shared through the state table."""
    if not spec:
        return None
    from fleet.aws.ratelimit import DynamoRateLimiter
    from fleet.clock import SystemClock
    from node.pacing import table_client

    limiter = DynamoRateLimiter(table_client(spec), spec["table"], SystemClock())
    group, per_s = spec["group"], float(spec["per_s"])

    def pace() -> None:
        limiter.wait(group, per_s)

    return pace


def pacer(job: dict[str, Any]) -> Pacer | None:
    """The crawl's pace: its site's group, then its domains, fleet-wide (None: a job that names no table)."""
    spec = job.get("pacing")
    if not spec:
        return None
    from fleet.aws.pacing import DynamoDomainPacer
    from fleet.clock import SystemClock
    from node.pacing import table_client

    domains = DynamoDomainPacer(table_client(spec), spec["table"], SystemClock())
    per_s = float(spec["per_domain_s"]) if spec.get("per_domain_s") else None
    return Pacer(group_pacer(job.get("rate_limit")), domains, spec["run_id"], per_s)


def preload() -> None:
    """Import what every browser crawl needs before the job arrives, so a spare process has it done."""
    import selenium.webdriver  # noqa: F401
    import selenium.webdriver.chrome.options  # noqa: F401

    import node.crawlers.links  # noqa: F401


def context(job: dict[str, Any], emit: Callable[..., None]) -> CrawlContext:
    """The crawl's context from its job."""
    paced = pacer(job)
    return CrawlContext(
        site=job["site"],
        start_url=job["start_url"],
        options=job.get("options") or {},
        attempt=job["attempt"],
        node_id=job["node_id"],
        grid_url=job["grid_url"],
        profile_dir=job["profile_dir"],
        chromium=job.get("chromium", "/usr/bin/chromium"),
        chrome_extra_args=tuple(job.get("chrome_args", ())),
        page_load_timeout_s=job.get("page_load_timeout_s", 600),
        user_agent=job.get("user_agent") or "",
        robots=bool(job.get("robots", True)),
        blocked_markers=tuple(job.get("blocked_markers") or ()),
        emit=emit,
        checkpoint=job.get("checkpoint"),
        mark=tuple(job.get("mark") or ()),
        pace=paced.pace if paced is not None else lambda url, delay: None,
        answered=paced.answered if paced is not None else lambda url, status: None,
        ended=paced.flush if paced is not None else lambda: None,
        grid_secret=GridSecret.read(Path(job["grid_secret_file"])) if job.get("grid_secret_file") else None,
    )


def _tally(crawler: Any) -> dict[str, Any]:
    """What a failed crawl had left out so far (collisions, items without an id), for the attempt's counts."""
    tally = getattr(crawler, "tally", None)
    return tally.plain() if tally is not None and hasattr(tally, "plain") else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gridfleet-crawler")
    ap.add_argument("--event-fd", type=int, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s crawler %(levelname)s %(message)s")
    out = os.fdopen(args.event_fd, "w", buffering=1, encoding="utf-8")
    lock = threading.Lock()

    def emit(**event: Any) -> None:
        if event.get("event") == "session":  # how long the Grid took to start the browser, for the node's log
            event.setdefault("request_s", round(time.monotonic() - got_job, 3))
        with lock:
            out.write(json.dumps(event, default=str) + "\n")
            out.flush()

    preload()
    raw = sys.stdin.read()  # a spare crawler process waits here, its imports done, until the node needs it
    got_job = time.monotonic()
    if not raw.strip():  # a spare the node did not need: it left, or ended the spare
        return 0
    job = json.loads(raw)
    ctx = context(job, emit)
    crawler = None
    failed = False  # a failed crawl's browser stays open for the agent to read, then close
    try:
        crawler = load_crawler(job["crawler"])(ctx)
        result = crawler.run()
        emit(event="result", **result)
        return 0
    except CrawlError as e:
        failed = True
        kind = "robots" if isinstance(e, RobotsDenied) else "crawl"  # robots: the site FAILED, not retried
        failure = Failure(FailureClass.ROBOTS) if isinstance(e, RobotsDenied) else of_exception(e)
        emit(event="error", kind=kind, message=str(e), failure=failure_to_event(failure), **_tally(crawler))
        return 1
    except Exception as e:  # the outermost frame of the crawler process: report, never hide
        failed = True
        emit(
            event="error",
            kind=type(e).__name__,
            message=f"{type(e).__name__}: {e}",
            failure=failure_to_event(of_exception(e)),
            trace=traceback.format_exc(limit=8),
            **_tally(crawler),
        )
        return 1
    finally:
        try:
            ctx.ended()  # what the crawl's pacing still holds
        except Exception:
            logging.getLogger("gridfleet.crawler").warning("sending the pacing counters failed", exc_info=True)
        if crawler is not None and not failed:
            try:
                crawler.close()
            except Exception:
                logging.getLogger("gridfleet.crawler").debug("closing the browser failed", exc_info=True)
        out.close()


if __name__ == "__main__":
    raise SystemExit(main())
