"""HubServer over real loopback sockets: routes, the event stream, a failing status source, stop and bind."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge

from hub.http_server import HubServer, host_allowed

POLL_S = 0.05
WAIT_S = 5.0


def initial_status() -> dict:
    return {
        "run_id": "2026-11-21",
        "finished": False,
        "updated_at": 1763700000.0,
        "counts": {"QUEUED": 1, "RUN": 1},
        "sites": {
            "a": {"run_status": "QUEUED", "site_status": "PENDING", "attemptCount": 0},
            "b": {"run_status": "RUN", "site_status": "URL_CALL", "attemptCount": 1, "instance_id": "i-1"},
        },
        "nodes": [],
        "kills": [],
        "queue": {"visible": 1, "in_flight": 1, "dlq": 0},
    }


class Source:
    """A status() over a mutable dict that can be made to fail, counting its calls."""

    def __init__(self) -> None:
        self.state = initial_status()
        self.failing = False
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        if self.failing:
            raise ConnectionError("table unreachable")
        return self.state


class Events:
    """A client of /events, reading with a socket timeout so a missing event fails rather than hangs."""

    def __init__(self, url: str, timeout_s: float = WAIT_S) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
        self.conn.request("GET", "/events")
        self.resp = self.conn.getresponse()

    def next_block(self) -> list[str]:
        """The lines of the next event or comment; EOFError when the server closed the stream."""
        lines: list[str] = []
        while True:
            raw = self.resp.readline()
            if not raw:
                raise EOFError("stream closed")
            line = raw.decode().rstrip("\r\n")
            if line:
                lines.append(line)
            elif lines:
                return lines

    def next_data(self) -> dict:
        block = self.next_block()
        assert len(block) == 1 and block[0].startswith("data: "), block
        return json.loads(block[0][len("data: ") :])

    def close(self) -> None:
        self.resp.close()  # the response holds the socket open too
        self.conn.close()


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT_S) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), err.read()


def wait_until(predicate, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s}s")
        time.sleep(0.01)


@pytest.fixture
def source() -> Source:
    return Source()


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Gauge("gridfleet_sites_running", "Sites being crawled now", registry=reg).set(2)
    return reg


@pytest.fixture
def serve():
    """Start HubServers; every one is stopped at the end of the test."""
    servers: list[HubServer] = []
    clients: list[Events] = []

    def start(
        status,
        registry=None,
        keepalive_s: float | None = None,
        max_streams: int | None = None,
        max_connections: int | None = None,
        **kw,
    ) -> HubServer:
        server = HubServer(status, registry, poll_s=POLL_S, **kw)
        if keepalive_s is not None:
            server.keepalive_s = keepalive_s
        if max_streams is not None:
            server.max_streams = max_streams
        if max_connections is not None:
            server.max_connections = max_connections
        servers.append(server)
        return server.start()

    start.clients = clients
    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


@pytest.fixture
def server(serve, source, registry) -> HubServer:
    return serve(source, registry)


def open_events(serve, url: str) -> Events:
    events = Events(url)
    serve.clients.append(events)
    return events


def test_status_is_the_status_as_json(server, source):
    status, headers, body = get(server.url + "status")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == source.state


def test_metrics_expose_the_registry(server):
    status, headers, body = get(server.url + "metrics")
    assert status == 200
    assert headers["Content-Type"] == CONTENT_TYPE_LATEST
    text = body.decode()
    assert "# TYPE gridfleet_sites_running gauge" in text
    assert "gridfleet_sites_running 2.0" in text


def test_metrics_without_a_registry_are_empty_not_the_global_registry(serve, source):
    server = serve(source, None)
    status, headers, body = get(server.url + "metrics")
    assert (status, headers["Content-Type"], body) == (200, CONTENT_TYPE_LATEST, b"")


def test_healthz_and_unknown_paths(server):
    assert get(server.url + "healthz")[::2] == (200, b"ok")
    for path in ("nope", "status/extra", "events/", "dashboard.html"):
        assert get(server.url + path)[0] == 404, path


class _Tags(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.external: list[tuple[str, str]] = []
        self.title = ""
        self._in_title = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        for name in ("src", "href"):
            if a.get(name):
                self.external.append((tag, a[name] or ""))
        if tag == "link":
            self.external.append((tag, str(a)))
        self._in_title = tag == "title"

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False


def test_dashboard_page_is_self_contained_html(server):
    status, headers, body = get(server.url)
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    page = _Tags(body.decode())
    assert page.title.startswith("gridfleet — run")
    assert page.external == []  # no scripts, styles or links loaded from elsewhere
    assert {"count-QUEUED", "count-RUN", "count-COMPLETED", "count-FAILED", "tiles", "kills", "conn"} <= page.ids
    assert "EventSource" in body.decode()
    assert "innerHTML" not in body.decode()


def test_events_send_the_status_at_once_then_each_change(serve, server, source):
    events = open_events(serve, server.url)
    assert events.resp.status == 200
    assert events.resp.getheader("Content-Type") == "text/event-stream"
    assert events.resp.getheader("Cache-Control") == "no-cache"
    assert events.next_data() == source.state

    source.state = {**source.state, "counts": {"RUN": 1, "COMPLETED": 1}}
    assert events.next_data() == source.state


def test_an_unchanged_status_sends_only_keepalives(serve, source):
    server = serve(source, keepalive_s=0.2)
    events = open_events(serve, server.url)
    assert events.next_data() == source.state
    calls = source.calls
    assert events.next_block() == [": keepalive"]
    assert source.calls > calls  # it was polled meanwhile and found unchanged
    source.state = {**source.state, "finished": True}
    assert events.next_data()["finished"] is True


def test_every_stream_gets_every_change(serve, server, source):
    first, second = open_events(serve, server.url), open_events(serve, server.url)
    assert first.next_data() == second.next_data() == source.state
    source.state = {**source.state, "finished": True}
    assert first.next_data() == second.next_data() == source.state


def test_a_failing_status_is_a_503_and_the_server_goes_on(server, source):
    source.failing = True
    status, headers, body = get(server.url + "status")
    assert status == 503
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"error": "ConnectionError: table unreachable"}

    source.failing = False
    status, _, body = get(server.url + "status")
    assert (status, json.loads(body)) == (200, source.state)


def test_a_status_that_json_cannot_hold_is_a_503(server, source):
    source.state = {"run_id": object()}
    status, _, body = get(server.url + "status")
    assert status == 503
    assert json.loads(body)["error"].startswith("TypeError")


def test_the_event_stream_skips_failed_polls(serve, server, source):
    events = open_events(serve, server.url)
    assert events.next_data() == source.state
    source.failing = True
    calls = source.calls
    wait_until(lambda: source.calls >= calls + 3)  # several polls failed while the stream stayed open
    source.state = {**source.state, "finished": True}
    source.failing = False
    assert events.next_data() == source.state  # the next event is the next good status, nothing in between


def test_a_stream_opened_while_the_status_fails_starts_with_the_first_good_one(serve, server, source):
    source.failing = True
    events = open_events(serve, server.url)
    calls = source.calls
    wait_until(lambda: source.calls >= calls + 2)
    source.failing = False
    assert events.next_data() == source.state


def test_stop_ends_open_streams_and_frees_the_port_promptly(serve, server, source):
    events = open_events(serve, server.url)
    assert events.next_data() == source.state
    port = urlsplit(server.url).port

    started = time.monotonic()
    server.stop()
    with pytest.raises(EOFError):
        events.next_block()
    assert time.monotonic() - started < 1.0

    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    again = serve(source, port=port)  # a restarted hub gets its port back at once
    assert get(again.url + "healthz")[0] == 200


def test_binding_a_taken_port_raises(serve, server, source):
    port = urlsplit(server.url).port
    with pytest.raises(OSError):
        serve(source, port=port)
    assert get(server.url + "healthz")[0] == 200  # the first one is unharmed


def test_url_names_the_bound_port(serve, source):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = serve(source, port=port)
    assert server.url == f"http://127.0.0.1:{port}/"


def test_stop_is_idempotent_and_a_server_starts_once(source):
    server = HubServer(source, poll_s=POLL_S)
    server.stop()  # never started: nothing to do
    with pytest.raises(RuntimeError):
        server.start()
    other = HubServer(source, poll_s=POLL_S).start()
    other.stop()
    other.stop()
    with pytest.raises(RuntimeError):
        other.start()


# --- another origin cannot read the run: the Host check and the connection caps ------------------------------


def request_with_host(url: str, path: str, host: str | None) -> tuple[int, dict[str, str], bytes]:
    """GET `path` sending `host` as the Host header (None: no Host header at all), as a rebound name would."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT_S)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, dict(resp.headers), resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "127.0.0.1.evil.example",
        "127.0.0.2",
        "[::1]:{port}",
        "localhost.",
        "127.0.0.1:x",
        "",
        None,
    ],
)
def test_a_request_naming_another_host_is_refused_and_reads_nothing(server, source, host):
    port = urlsplit(server.url).port
    calls = source.calls
    for path in ("/status", "/events", "/", "/metrics"):
        status, _, body = request_with_host(server.url, path, host.format(port=port) if host is not None else None)
        assert status == 421, (path, host)
        assert b"sites" not in body
    assert source.calls == calls  # the run's status was never read for it


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:{port}", "localhost", "LOCALHOST:{port}", "localhost:9000"])
def test_the_loopback_address_and_localhost_are_answered_with_or_without_a_port(server, source, host):
    port = urlsplit(server.url).port
    status, _, body = request_with_host(server.url, "/status", host.format(port=port))
    assert (status, json.loads(body)) == (200, source.state)


def test_which_hosts_each_bind_address_answers_to():
    assert host_allowed("10.0.1.5:8787", "10.0.1.5", "hub") and host_allowed("10.0.1.5", "10.0.1.5", "hub")
    assert not host_allowed("localhost", "10.0.1.5", "hub") and not host_allowed("10.0.1.6", "10.0.1.5", "hub")
    for wildcard in ("0.0.0.0", "::"):
        for ok in ("10.0.1.5:8787", "[fe80::1]:8787", "hub", "HUB:8787", "localhost", "0.0.0.0:8787"):
            assert host_allowed(ok, wildcard, "hub"), (ok, wildcard)
        for bad in ("evil.example", "hub.evil.example", "10.0.1.5.nip.io", "", None):
            assert not host_allowed(bad, wildcard, "hub"), (bad, wildcard)
    assert host_allowed("[::1]:8787", "::1", "hub") and not host_allowed("127.0.0.1", "::1", "hub")
    assert host_allowed("127.0.0.1:8787", "localhost", "hub") and not host_allowed("evil.example", "localhost", "hub")


def test_one_event_stream_over_the_cap_gets_a_503_with_retry_after_until_one_closes(serve, source):
    server = serve(source, max_streams=2, keepalive_s=0.1)
    first, second = open_events(serve, server.url), open_events(serve, server.url)
    assert first.next_data() == second.next_data() == source.state
    status, headers, _ = get(server.url + "events")
    assert status == 503 and int(headers["Retry-After"]) > 0
    assert get(server.url + "status")[0] == 200  # the rest of the server still answers

    first.close()  # its place is freed once the server notices (its next keepalive fails)

    def admitted() -> bool:
        third = Events(server.url)
        serve.clients.append(third)
        return third.resp.status == 200

    wait_until(admitted)


def test_connections_over_the_cap_are_answered_503_at_once_without_a_thread(serve, source):
    server = serve(source, max_connections=3)
    port = urlsplit(server.url).port
    idle = [socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) for _ in range(3)]  # never send a byte
    try:
        wait_until(lambda: get(server.url + "healthz")[0] == 503)
        status, headers, body = get(server.url + "status")
        assert (status, body) == (503, b"too many connections") and int(headers["Retry-After"]) > 0
        assert source.calls == 0
    finally:
        for sock in idle:
            sock.close()
    wait_until(lambda: get(server.url + "healthz")[0] == 200)  # their threads ended: the places are free again
