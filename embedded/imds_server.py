"""An IMDSv2 emulator on 127.0.0.1, for the embedded default and the tests.

EC2's metadata service is per instance at a fixed address; this one serves
several instances, each under its own prefix: `http://127.0.0.1:<port>/<instance id>`
is that instance's base URL. It enforces the IMDSv2 rules that matter (a token
from `PUT /latest/api/token` is required on every GET) and lets a test or an
operator post a spot interruption notice: `POST /_spot/<instance id>`, with the
stack's token in an `X-Gridfleet-Token` header (else 403; any other method 405),
so that no page a browser of the machine opens can interrupt a node.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleet.httpd import TOKEN_ENV, TOKEN_HEADER, token_ok


class _State:
    def __init__(self, token: str) -> None:
        self.token = token  # what a spot notice must carry
        self.lock = threading.Lock()
        self.tokens: set[str] = set()
        self.instances: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, had a valid token)

    def instance(self, iid: str) -> dict[str, Any]:
        with self.lock:
            return self.instances.setdefault(iid, {"local-ipv4": "127.0.0.1", "tags": {}, "spot": None})

    def post_spot(self, iid: str) -> None:
        """EC2's two-minute interruption notice for instance `iid`."""
        when = (datetime.now(UTC) + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.instance(iid)["spot"] = {"action": "terminate", "time": when}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(
        self, code: int, body: str = "", ctype: str = "text/plain", headers: dict[str, str] | None = None
    ) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _spot_path(self) -> bool:
        return self.path.strip("/").split("/")[0] == "_spot"

    def _post_only(self) -> None:
        self._send(405, "POST only", headers={"Allow": "POST"})

    def do_PUT(self) -> None:
        st = self.server.state
        parts = self.path.strip("/").split("/")
        if self._spot_path():
            self._post_only()
        elif parts[1:] == ["latest", "api", "token"] and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            token = secrets.token_urlsafe(24)
            with st.lock:
                st.tokens.add(token)
            self._send(200, token)
        else:
            self._send(400, "bad token request")

    def do_POST(self) -> None:
        st = self.server.state
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "_spot":
            if token_ok(self.headers.get(TOKEN_HEADER), st.token):
                st.post_spot(parts[1])
                self._send(200, "ok")
            else:
                self._send(403, f"a valid {TOKEN_HEADER} header is required")
        else:
            self._send(404, "not found")

    def do_GET(self) -> None:
        st = self.server.state
        if self.path == "/_health":
            self._send(200, "ok")
            return
        if self._spot_path():
            self._post_only()
            return
        parts = self.path.strip("/").split("/")
        token_ok = self.headers.get("X-aws-ec2-metadata-token") in st.tokens
        with st.lock:
            st.requests.append(("GET", self.path, token_ok))
        if not token_ok:
            self._send(401, "IMDSv2: a session token is required")
            return
        if len(parts) < 3 or parts[1] != "latest":
            self._send(404, "not found")
            return
        iid, rest = parts[0], parts[2:]
        inst = st.instance(iid)
        value: str | None = None
        if rest == ["meta-data", "instance-id"]:
            value = iid
        elif rest == ["meta-data", "local-ipv4"]:
            value = inst["local-ipv4"]
        elif rest[:3] == ["meta-data", "tags", "instance"] and len(rest) == 4:
            value = inst["tags"].get(rest[3])
        elif rest == ["meta-data", "spot", "instance-action"] and inst["spot"]:
            value = json.dumps(inst["spot"])
        elif rest[0] == "meta-data" and "/".join(rest[1:]) in inst.get("meta", {}):
            value = inst["meta"]["/".join(rest[1:])]  # e.g. placement/region, instance-type
        if value is None:
            self._send(404, "not found")
        else:
            self._send(200, value)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: _State):
        self.state = state
        super().__init__(address, _Handler)


class ImdsServer:
    """The emulator on a daemon thread. `token` is what `POST /_spot/<id>` must carry; without one the server
    makes its own (`self.token`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        self.token = token or secrets.token_urlsafe(32)
        self.state = _State(self.token)
        self._httpd = _Server((host, port), self.state)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def start(self) -> ImdsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address
        return f"http://{host}:{port}"

    def base_url(self, instance_id: str) -> str:
        return f"{self.url}/{instance_id}"

    def set(self, instance_id: str, *, local_ipv4: str | None = None, tags: dict[str, str] | None = None) -> None:
        inst = self.state.instance(instance_id)
        if local_ipv4 is not None:
            inst["local-ipv4"] = local_ipv4
        if tags:
            inst["tags"].update(tags)

    def spot_notice(self, instance_id: str) -> None:
        """Post a spot notice from this process (an HTTP client posts it with the token)."""
        self.state.post_spot(instance_id)

    def __enter__(self) -> ImdsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    import argparse
    import signal

    ap = argparse.ArgumentParser(
        prog="python -m embedded.imds_server", description="Serve an IMDSv2 emulator for local instances."
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with ImdsServer(args.host, args.port, token=os.environ.get(TOKEN_ENV)) as server:
        print(f"imds emulator on {server.url}", flush=True)
        done.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
