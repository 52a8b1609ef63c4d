"""The hub's HTTP face: a live dashboard, the run's status as JSON, Prometheus metrics.

People watch a run in a browser (``/``, kept current by the Server-Sent Events
stream ``/events``), scripts read ``/status``, Prometheus scrapes ``/metrics``.
The server lives inside the hub's process on daemon threads, so nothing here may
take the hub down: a ``status()`` that raises (the run's table briefly out of
reach) becomes a 503 or a skipped event, and clients that go away are dropped
quietly. Every open stream shares one poller, so what ``status()`` costs does not
grow with the number of open dashboards, and nothing is polled while no one watches.

A page of another origin must not read the run: every request's ``Host`` must name
the address the server is bound to (a name of the attacker's that was rebound to
127.0.0.1 is answered 421), and the live connections are capped (``max_streams``
event streams, ``max_connections`` in all; one more is answered 503 with a
``Retry-After``) so that no page can use up the hub's threads.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fleet.httpd import QuietHandler
from hub.dashboard import PAGE_HEADERS, StatusFeed, StatusFn, StatusUnavailable, page_html, status_json

log = logging.getLogger("gridfleet.http")

KEEPALIVE_S = 15.0
MAX_STREAMS = 32  # event streams open at once
MAX_CONNECTIONS = 64  # connections being served at once, event streams included
RETRY_AFTER_S = 5
_IO_TIMEOUT_S = 30.0  # a client that neither sends its request nor reads for this long is dropped
_STOP_JOIN_S = 1.0
_TEXT = "text/plain; charset=utf-8"


def host_allowed(host_header: str | None, bind: str, hostname: str) -> bool:
    """Whether a request's Host header names this server, bound to `bind` on the machine called `hostname`.

    A loopback bind answers to its address and `localhost`; another address to itself; a wildcard bind
    (0.0.0.0, ::) to any IP literal, `localhost` and the machine's name. Any port is accepted: a port forward
    (an SSM session) may use another local port, and a rebinding attack is told by its name, not its port.
    """
    if not host_header:
        return False
    host = _host_part(host_header.strip().lower())
    if host is None:
        return False
    ip = _ip(host)
    bound = _ip(bind)
    if bind in ("", "0.0.0.0", "::"):
        return ip is not None or host in ("localhost", hostname.lower())
    if bind.lower() == "localhost":
        return host == "localhost" or (ip is not None and ip.is_loopback)
    if bound is not None and bound.is_loopback:
        return host == "localhost" or ip == bound
    return ip == bound if bound is not None else host == bind.lower()


def _host_part(value: str) -> str | None:
    """The host of a Host header value (`name`, `name:port`, `[v6]`, `[v6]:port`), or None if it is malformed."""
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
        return host if sep and (not rest or (rest.startswith(":") and port.isdigit())) else None
    host, sep, port = value.partition(":")
    if sep and not port.isdigit():
        return None
    return host or None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() closes event streams itself rather than waiting for them
    allow_reuse_port = False  # a port another server listens on must fail to bind

    def __init__(
        self,
        address: tuple[str, int],
        *,
        status: StatusFn,
        registry: CollectorRegistry,
        feed: StatusFeed,
        stopping: threading.Event,
        keepalive_s: float,
        page: bytes,
        max_streams: int,
        max_connections: int,
    ) -> None:
        self.status = status
        self.registry = registry
        self.feed = feed
        self.stopping = stopping
        self.keepalive_s = keepalive_s
        self.page = page
        self.bind = address[0]
        self.hostname = socket.gethostname()
        self.max_streams = max_streams
        self.max_connections = max_connections
        self._streams: set[socket.socket] = set()
        self._streams_lock = threading.Lock()
        self._live = 0  # connections being served
        self._live_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the bound address's name in DNS, which can stall for
        # seconds where DNS is out of reach; nothing here uses that name.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own, or refuse it at once when `max_connections` are served."""
        with self._live_lock:
            full = self._live >= self.max_connections
            if not full:
                self._live += 1
        if full:
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connection_done()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connection_done()

    def _connection_done(self) -> None:
        with self._live_lock:
            self._live -= 1

    @contextmanager
    def stream(self, sock: socket.socket) -> Iterator[bool]:
        """Hold one of the `max_streams` event stream places for `sock`; yields False when none is free."""
        with self._streams_lock:
            admitted = len(self._streams) < self.max_streams
            if admitted:
                self._streams.add(sock)
        try:
            yield admitted
        finally:
            if admitted:
                with self._streams_lock:
                    self._streams.discard(sock)

    def close_streams(self) -> None:
        """Cut every open event stream, even one whose thread is blocked in a write."""
        with self._streams_lock:
            socks = list(self._streams)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its client

    def handle_error(self, request: Any, client_address: Any) -> None:
        gone = isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError))
        log.log(logging.DEBUG if gone else logging.WARNING, "error serving %s", client_address, exc_info=True)


def _refuse_busy(sock: socket.socket) -> None:
    """A 503 written straight to a connection that gets no thread (a few bytes: the send never blocks for long)."""
    body = b"too many connections"
    head = (
        f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: {_TEXT}\r\nContent-Length: {len(body)}\r\n"
        f"Retry-After: {RETRY_AFTER_S}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        sock.settimeout(1.0)
        sock.sendall(head + body)
    except OSError:
        pass  # the client went away first


class _Handler(QuietHandler):
    server: _Server
    server_version = "gridfleet-hub/1"
    timeout = _IO_TIMEOUT_S
    log = log

    def parse_request(self) -> bool:
        """The request line and headers, then the Host check for every method: 421 unless it names this server."""
        if not super().parse_request():
            return False
        if not host_allowed(self.headers.get("Host"), self.server.bind, self.server.hostname):
            log.debug("refused a request from %s for host %r", self.address_string(), self.headers.get("Host"))
            self._send(421, b"this server does not answer to that host name", _TEXT)
            return False
        return True

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/":
            self._send(200, self.server.page, "text/html; charset=utf-8", PAGE_HEADERS)
        elif path == "/status":
            self._status()
        elif path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/events":
            self._events()
        elif path == "/healthz":
            self._send(200, b"ok", _TEXT)
        else:
            self._send(404, b"not found", _TEXT)

    def _status(self) -> None:
        try:
            text = status_json(self.server.status)
        except StatusUnavailable as exc:
            log.debug("/status: %s", exc.args[0])
            self._send(503, json.dumps({"error": exc.args[0]}).encode(), "application/json")
            return
        self._send(200, text.encode(), "application/json")

    def _events(self) -> None:
        self.close_connection = True
        try:
            with self.server.stream(self.connection) as admitted:
                if not admitted:
                    self._send(503, b"too many event streams", _TEXT, {"Retry-After": str(RETRY_AFTER_S)})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                with self.server.feed.viewer():
                    self._pump_events()
        except OSError:
            log.debug("event stream to %s ended by its client", self.address_string())

    def _pump_events(self) -> None:
        """Send the status at once, then each change, with a comment whenever the line was quiet too long."""
        server = self.server
        seen = 0
        last_write = time.monotonic()
        while not server.stopping.is_set():
            quiet_s = time.monotonic() - last_write
            news = server.feed.wait_newer(seen, max(server.keepalive_s - quiet_s, 0.0))
            if server.stopping.is_set():
                return
            if news is not None:
                seen, text = news
                self.wfile.write(f"data: {text}\n\n".encode())
            elif time.monotonic() - last_write >= server.keepalive_s:
                self.wfile.write(b": keepalive\n\n")
            else:
                continue
            last_write = time.monotonic()


class HubServer:
    """The dashboard, /status, /metrics and /events of one hub, served from daemon threads.

    `keepalive_s` is how long an event stream may stay silent before it gets a comment line
    (which lets clients and proxies tell a quiet run from a dead connection); `max_streams` and
    `max_connections` cap what is served at once. Set them before start().
    """

    keepalive_s: float = KEEPALIVE_S
    max_streams: int = MAX_STREAMS
    max_connections: int = MAX_CONNECTIONS

    def __init__(
        self,
        status: StatusFn,
        registry: CollectorRegistry | None = None,
        *,
        bind: str = "127.0.0.1",
        port: int = 0,
        poll_s: float = 0.5,
    ) -> None:
        self._status = status
        self._registry = registry if registry is not None else CollectorRegistry()
        self._address = (bind, port)
        self._stopping = threading.Event()
        self._feed = StatusFeed(status, poll_s, self._stopping)
        self._httpd: _Server | None = None
        self._serve_thread: threading.Thread | None = None

    def start(self) -> HubServer:
        """Bind (port 0: any free port) and serve; OSError if the address cannot be bound."""
        if self._httpd is not None or self._stopping.is_set():
            raise RuntimeError("a HubServer can be started only once")
        page = page_html()
        self._httpd = _Server(
            self._address,
            status=self._status,
            registry=self._registry,
            feed=self._feed,
            stopping=self._stopping,
            keepalive_s=self.keepalive_s,
            page=page,
            max_streams=self.max_streams,
            max_connections=self.max_connections,
        )
        port = self._httpd.server_address[1]
        self._serve_thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name=f"hub-http-{port}", daemon=True
        )
        self._serve_thread.start()
        threading.Thread(target=self._feed.run, name=f"hub-http-feed-{port}", daemon=True).start()
        log.debug("dashboard on %s", self.url)
        return self

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the HubServer has not been started")
        return f"http://{self._httpd.server_name}:{self._httpd.server_port}/"

    def stop(self) -> None:
        """Stop accepting, close the listening socket and cut every open event stream."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._feed.close()
        if self._httpd is None or self._serve_thread is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_streams()
        self._serve_thread.join(_STOP_JOIN_S)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
