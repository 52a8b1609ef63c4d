"""A Grid whose chromedriver is busy with a hung navigation, at the two seams evidence reads: WebDriver calls on
the session take the connection and never answer, while the session's DevTools websocket (`/session/<id>/se/cdp`)
answers as a browser does (its targets, an attach, a screenshot), with an event before each answer."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import threading
from typing import Any

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class BusyGrid:
    def __init__(self, png: bytes, page_url: str = "http://site.test/hangs/2", cdp: bool = True):
        self.png, self.page_url, self.cdp = png, page_url, cdp
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.requests: list[str] = []  # each request line, in order
        self.cdp_calls: list[dict[str, Any]] = []
        self.authorization: list[str | None] = []
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def __enter__(self) -> BusyGrid:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.server.close()
        for c in self._held:
            c.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        lines = head.decode("latin-1").split("\r\n")
        self.requests.append(lines[0])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.authorization.append(headers.get("authorization"))
        if headers.get("upgrade", "").lower() != "websocket" or not self.cdp:
            self._held.append(conn)  # chromedriver is busy: no answer, ever
            return
        accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + WS_GUID).encode()).digest()).decode()
        conn.sendall(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
        )
        try:
            while True:
                message = _read_frame(conn)
                if message is None:
                    return
                call = json.loads(message)
                self.cdp_calls.append(call)
                _send(conn, json.dumps({"method": "Network.requestWillBeSent", "params": {}}))  # an event first
                _send(conn, json.dumps({"id": call["id"], "result": self._answer(call)}))
        except OSError:
            return
        finally:
            conn.close()

    def _answer(self, call: dict[str, Any]) -> dict[str, Any]:
        if call["method"] == "Target.getTargets":
            return {
                "targetInfos": [
                    {"targetId": "ui", "type": "browser_ui", "url": "chrome://omnibox/", "attached": False},
                    {"targetId": "other", "type": "page", "url": "about:blank", "attached": False},
                    {"targetId": "tab", "type": "page", "url": self.page_url, "attached": True},
                ]
            }
        if call["method"] == "Target.attachToTarget":
            return {"sessionId": f"s-{call['params']['targetId']}"}
        if call["method"] == "Page.captureScreenshot":
            return {"data": base64.b64encode(self.png).decode()}
        return {}


def _read_frame(conn: socket.socket) -> str | None:
    head = _exactly(conn, 2)
    if head is None:
        return None
    opcode, length = head[0] & 0x0F, head[1] & 0x7F
    if length == 126:
        length = struct.unpack(">H", _exactly(conn, 2) or b"\0\0")[0]
    elif length == 127:
        length = struct.unpack(">Q", _exactly(conn, 8) or b"\0" * 8)[0]
    mask = _exactly(conn, 4) if head[1] & 0x80 else b"\0\0\0\0"
    data = _exactly(conn, length) or b""
    if opcode == 8 or mask is None:  # close
        return None
    return bytes(b ^ mask[i % 4] for i, b in enumerate(data)).decode()


def _exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _send(conn: socket.socket, text: str) -> None:
    data = text.encode()
    if len(data) < 126:
        head = bytes([0x81, len(data)])
    elif len(data) < 65536:
        head = bytes([0x81, 126]) + struct.pack(">H", len(data))
    else:
        head = bytes([0x81, 127]) + struct.pack(">Q", len(data))
    conn.sendall(head + data)
