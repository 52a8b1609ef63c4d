"""A page's screenshot over the Chrome DevTools protocol, for a browser whose WebDriver cannot answer.

A hung navigation keeps chromedriver busy: every WebDriver call on the session waits behind it, so evidence read
over WebDriver gets nothing. The browser itself still renders and answers DevTools. The Grid proxies each
session's DevTools connection at `<grid>/session/<id>/se/cdp` (the `se:cdp` capability), a websocket to the
browser's own endpoint (its browser target): the page the session drives is found among the browser's targets
(the page target attached to chromedriver, else the first page), a flat session is attached to it, and
`Page.captureScreenshot` is asked for. The target's URL (the one being loaded) comes with it.

Bounded as the rest of the capture: one deadline over the connection and every message (a websocket timeout of
what is left), at most `MAX_MESSAGES` messages read while waiting for an answer, an answer over
`max_bytes` dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from fleet.grid_auth import GridSecret

#: Messages read while waiting for one answer (events come between: a page being loaded sends many).
MAX_MESSAGES = 1000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class DevToolsFailed(Exception):
    """The DevTools endpoint did not answer in time, or answered with no screenshot; args[0] says how."""


def cdp_url(grid_url: str, session_id: str) -> str:
    """The Grid's DevTools websocket of the session (the URL its `se:cdp` capability names)."""
    base = grid_url.rstrip("/")
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/session/{session_id}/se/cdp"


def screenshot(
    grid_url: str,
    session_id: str,
    deadline: float,
    monotonic: Callable[[], float],
    secret: GridSecret | None = None,
    max_bytes: int = 16 * 1024 * 1024,
) -> tuple[bytes, str | None]:
    """The PNG the session's page shows now and the URL its target is at; DevToolsFailed when not by `deadline`
    (on the `monotonic` clock). The session id is checked by the caller (a plain token)."""
    import websocket  # websocket-client, which selenium brings: loaded only when a browser did not answer

    def left() -> float:
        remaining = deadline - monotonic()
        if remaining <= 0:
            raise DevToolsFailed("the capture's time budget is spent")
        return remaining

    header = [f"Authorization: {secret.authorization}"] if secret is not None else []
    try:
        ws = websocket.create_connection(cdp_url(grid_url, session_id), timeout=left(), header=header)
    except (OSError, websocket.WebSocketException) as e:
        raise DevToolsFailed(f"se/cdp: {type(e).__name__}: {e}") from None
    try:
        talk = _Talk(ws, left, max_bytes)
        page = _page_target(talk.call("Target.getTargets")["targetInfos"])
        attached = talk.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})
        shot = talk.call("Page.captureScreenshot", {"format": "png"}, attached["sessionId"])
        png = _png(shot.get("data"))
        url = page.get("url")
        return png, url if isinstance(url, str) else None
    except (OSError, websocket.WebSocketException) as e:
        raise DevToolsFailed(f"se/cdp: {type(e).__name__}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise DevToolsFailed(f"se/cdp: not a DevTools answer ({type(e).__name__}: {e})") from None
    finally:
        try:
            ws.close(timeout=0.2)
        except Exception:  # noqa: BLE001 - a socket already gone: nothing to close
            pass


class _Talk:
    """Numbered DevTools calls on one websocket, each answer waited for within what is left of the deadline."""

    def __init__(self, ws: Any, left: Callable[[], float], max_bytes: int):
        self.ws, self.left, self.max_bytes, self.n = ws, left, max_bytes, 0

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.n += 1
        message: dict[str, Any] = {"id": self.n, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self.ws.settimeout(self.left())
        self.ws.send(json.dumps(message))
        for _ in range(MAX_MESSAGES):
            self.ws.settimeout(self.left())
            raw = self.ws.recv()
            if len(raw) > self.max_bytes:
                raise DevToolsFailed(f"{method}: answer over {self.max_bytes} bytes")
            answer = json.loads(raw)
            if not isinstance(answer, dict) or answer.get("id") != self.n:
                continue  # an event, or the answer to something else
            if "error" in answer:
                raise DevToolsFailed(f"{method}: {str(answer['error'])[:200]}")
            result = answer.get("result")
            if not isinstance(result, dict):
                raise ValueError(f"{method}: no result")
            return result
        raise DevToolsFailed(f"{method}: no answer among {MAX_MESSAGES} messages")


def _page_target(targets: object) -> dict[str, Any]:
    """The page the session drives: the page target attached to chromedriver, else the first page."""
    pages = [t for t in targets if isinstance(t, dict) and t.get("type") == "page"] if isinstance(targets, list) else []
    if not pages:
        raise DevToolsFailed("se/cdp: the browser has no page")
    attached = [t for t in pages if t.get("attached")]
    return (attached or pages)[0]


def _png(value: object) -> bytes:
    try:
        data = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        data = b""
    if not data.startswith(PNG_MAGIC):
        raise DevToolsFailed("se/cdp: the screenshot is not a PNG")
    return data
