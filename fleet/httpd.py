"""The request handler base of gridfleet's small HTTP servers (the hub's dashboard, the demo sites).

Each response is written whole with its length and `Connection: close`; a client
that went away is a debug line, and request lines go to the debug log, not stderr.
The embedded stack's servers change state (a reset, a spot notice) only for a
request carrying the stack's token in `TOKEN_HEADER`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any

#: The header a state-changing request to a server of the embedded stack carries its token in.
TOKEN_HEADER = "X-Gridfleet-Token"
#: The environment variable the local stack hands its token to the servers it starts in (not their command line,
#: which every user of the machine can read).
TOKEN_ENV = "GRIDFLEET_STACK_TOKEN"


def token_ok(given: str | None, token: str) -> bool:
    """Whether a request's token is the server's token (compared in constant time; an empty token never is)."""
    return bool(token) and given is not None and hmac.compare_digest(given.encode(), token.encode())


class QuietHandler(BaseHTTPRequestHandler):
    log = logging.getLogger("gridfleet.http")

    def log_message(self, format: str, *args: Any) -> None:
        self.log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.close_connection = True
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.log.debug("client %s went away before the response was written", self.address_string())
