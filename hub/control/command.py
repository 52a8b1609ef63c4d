"""The command both remote rungs of the kill ladder run on a node, and how their failures are told.

SSM and SSH run the same command, `gridfleet node kill --site S --attempt N`, which reads the node's
`crawler.json` and signals the crawler's process group only if it still runs that site and attempt. A kill that
arrives late, or twice, therefore never touches the next crawl.
"""

from __future__ import annotations

import shlex

from botocore.exceptions import ClientError

from fleet.aws.clients import error_code

DEFAULT_GRIDFLEET_BIN = "/opt/gridfleet/venv/bin/gridfleet"
DEFAULT_STATE_DIR = "/var/lib/gridfleet"

_DETAIL_TAIL = 300


def kill_command(
    site: str, attempt: int, gridfleet_bin: str = DEFAULT_GRIDFLEET_BIN, state_dir: str = DEFAULT_STATE_DIR
) -> str:
    """The shell command that ends the crawl of `site`, attempt `attempt`, on a node (exit 0: it no longer runs)."""
    return " ".join(
        [
            shlex.quote(gridfleet_bin),
            "node",
            "kill",
            "--state-dir",
            shlex.quote(state_dir),
            "--site",
            shlex.quote(site),
            "--attempt",
            shlex.quote(str(int(attempt))),
        ]
    )


def output_tail(text: str | bytes | None, limit: int = _DETAIL_TAIL) -> str:
    """The end of some command output, on one line."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    flat = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return flat if len(flat) <= limit else "..." + flat[-limit:]


def error_detail(e: BaseException) -> str:
    if isinstance(e, ClientError):
        msg = e.response.get("Error", {}).get("Message") or str(e)
        return f"{error_code(e)}: {msg}"
    return f"{type(e).__name__}: {e}"
