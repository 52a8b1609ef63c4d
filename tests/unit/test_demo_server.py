from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit

import pytest

from embedded.demo_server import DemoServer

REPO = Path(__file__).resolve().parents[2]


class _Page(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.title = ""
        self.item_ids: list[str] = []
        self.next_hrefs: list[str] = []
        self._in_title = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "title":
            self._in_title = True
        elif tag == "a" and a.get("class") == "item":
            self.item_ids.append(a["data-id"] or "")
        elif tag == "a" and a.get("class") == "next":
            self.next_hrefs.append(a["href"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


def fetch(
    url: str, method: str = "GET", timeout: float = 5, headers: dict[str, str] | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers, err.read()


def page(url: str) -> tuple[int, _Page]:
    status, _, body = fetch(url)
    return status, _Page(body.decode())


@pytest.fixture
def server():
    with DemoServer() as srv:
        yield srv


def test_page_lists_ten_items_and_a_next_link_keeping_params(server):
    url = f"{server.base_url}/s/shop/?pages=3&delay_s=0&fail_attempts=0"
    status, headers, body = fetch(url)
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert int(headers["Content-Length"]) == len(body)
    p = _Page(body.decode())
    assert p.title == "shop page 1"
    assert p.item_ids == [f"shop-1-{i}" for i in range(1, 11)]
    assert len(p.next_hrefs) == 1
    nxt = urlsplit(p.next_hrefs[0])
    assert nxt.path == "/s/shop/"
    assert dict(parse_qsl(nxt.query)) == {
        "pages": "3",
        "delay_s": "0",
        "fail_attempts": "0",
        "page": "2",
    }

    status, p2 = page(urljoin(url, p.next_hrefs[0]))
    assert status == 200
    assert p2.title == "shop page 2"
    assert p2.item_ids == [f"shop-2-{i}" for i in range(1, 11)]
    assert dict(parse_qsl(urlsplit(p2.next_hrefs[0]).query))["page"] == "3"


def test_last_page_has_no_next_link(server):
    status, p = page(f"{server.base_url}/s/shop/?pages=2&page=2")
    assert status == 200
    assert p.item_ids == [f"shop-2-{i}" for i in range(1, 11)]
    assert p.next_hrefs == []

    status, single = page(f"{server.base_url}/s/solo/")
    assert status == 200
    assert len(single.item_ids) == 10
    assert single.next_hrefs == []


def test_page_one_is_the_url_without_page(server):
    _, _, implicit = fetch(f"{server.base_url}/s/shop/?pages=2")
    _, _, explicit = fetch(f"{server.base_url}/s/shop/?pages=2&page=1")
    assert implicit == explicit
    assert server.stats()["sites"]["shop"]["hits"] == {"1": 2}


def test_trailing_slash_is_optional_and_item_links_answer(server):
    status, p = page(f"{server.base_url}/s/shop")
    assert status == 200
    assert p.item_ids[0] == "shop-1-1"
    status, _, body = fetch(f"{server.base_url}/item/shop-1-1")
    assert status == 200
    assert b"shop-1-1" in body


def test_delay_is_honoured(server):
    start = time.monotonic()
    status, _, _ = fetch(f"{server.base_url}/s/slow/?delay_s=0.3")
    assert status == 200
    assert time.monotonic() - start >= 0.3


def test_hang_page_hangs_only_the_first_attempts(server):
    host, port = urlsplit(server.base_url).netloc.split(":")
    path = "/s/sticky/?pages=3&page=2&hang_page=2&hang_attempts=1"
    conn = http.client.HTTPConnection(host, int(port), timeout=0.5)
    try:
        conn.request("GET", path)
        with pytest.raises(TimeoutError):
            conn.getresponse()
    finally:
        conn.close()

    status, p = page(server.base_url + path)
    assert status == 200
    assert p.item_ids[0] == "sticky-2-1"
    # other pages of the same site are not affected
    assert page(f"{server.base_url}/s/sticky/?pages=3&hang_page=2&hang_attempts=1")[0] == 200
    assert server.stats()["sites"]["sticky"]["hits"] == {"1": 1, "2": 2}


def test_fail_attempts_fail_page_one_then_recover(server):
    url = f"{server.base_url}/s/flaky/?pages=2&fail_attempts=2"
    for _ in range(2):
        status, headers, body = fetch(url)
        assert status == 500
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert _Page(body.decode()).item_ids == []
    status, p = page(url)
    assert status == 200
    assert len(p.item_ids) == 10
    assert page(url + "&page=2")[0] == 200


def test_stats_count_hits_per_page_and_arrival_times(server):
    before = time.time()
    for query in ("pages=2", "pages=2&page=2", "pages=2", "pages=2&page=3"):
        fetch(f"{server.base_url}/s/a/?{query}")
    fetch(f"{server.base_url}/s/b/")
    after = time.time()

    status, headers, body = fetch(f"{server.base_url}/_stats")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    stats = json.loads(body)
    assert stats == server.stats()
    a, b = stats["sites"]["a"], stats["sites"]["b"]
    assert a["hits"] == {"1": 2, "2": 1}  # the 404 for page 3 is not counted
    assert b["hits"] == {"1": 1}
    assert len(a["times"]) == 3 and len(b["times"]) == 1
    assert a["times"] == sorted(a["times"])
    assert all(before <= t <= after for t in a["times"] + b["times"])
    assert a["times"][-1] <= b["times"][0]
    # one [epoch_s, page] per counted request, in arrival order, at the times above
    assert [p for _, p in a["requests"]] == [1, 2, 1] and [p for _, p in b["requests"]] == [1]
    assert [t for t, _ in a["requests"]] == a["times"] and [t for t, _ in b["requests"]] == b["times"]


def test_stats_keep_the_last_requests_of_each_site_only(monkeypatch):
    monkeypatch.setattr("embedded.demo_server.MAX_REQUESTS_KEPT", 3)
    with DemoServer() as small:  # a server started after the bound was lowered
        for page_no in (1, 2, 3, 4, 5):
            fetch(f"{small.base_url}/s/many/?pages=5&page={page_no}")
        many = small.stats()["sites"]["many"]
    assert [p for _, p in many["requests"]] == [3, 4, 5]
    assert many["hits"] == {str(p): 1 for p in range(1, 6)}  # the counts stay whole


def test_reset_with_the_token_clears_stats_and_attempt_counters(server):
    url = f"{server.base_url}/s/flaky/?fail_attempts=1"
    assert fetch(url)[0] == 500
    assert fetch(url)[0] == 200

    status, _, body = fetch(f"{server.base_url}/_reset", method="POST", headers={"X-Gridfleet-Token": server.token})
    assert status == 200
    assert json.loads(body) == {"ok": True}
    assert server.stats() == {"sites": {}}
    assert fetch(url)[0] == 500


@pytest.mark.parametrize(
    "method, headers, expected",
    [
        ("GET", {}, 405),
        ("GET", "token", 405),  # a page can make a browser GET anything: a reset is never a GET
        ("POST", {}, 403),
        ("POST", {"X-Gridfleet-Token": ""}, 403),
        ("POST", {"X-Gridfleet-Token": "guess"}, 403),
    ],
)
def test_reset_without_the_token_or_by_get_changes_nothing(server, method, headers, expected):
    url = f"{server.base_url}/s/flaky/?fail_attempts=1"
    assert fetch(url)[0] == 500
    before = server.stats()
    sent = {"X-Gridfleet-Token": server.token} if headers == "token" else headers
    status, resp_headers, _ = fetch(f"{server.base_url}/_reset", method=method, headers=sent)
    assert status == expected
    if expected == 405:
        assert resp_headers["Allow"] == "POST"
    assert server.stats() == before
    assert fetch(url)[0] == 200  # the attempt counter was not reset either


def test_a_server_takes_the_token_it_is_given_and_answers_no_other():
    with DemoServer(token="stack-token") as srv:
        assert srv.token == "stack-token"
        assert fetch(f"{srv.base_url}/_reset", "POST", headers={"X-Gridfleet-Token": "stack-token"})[0] == 200
        with DemoServer() as other:
            assert other.token and other.token != "stack-token"
            assert fetch(f"{other.base_url}/_reset", "POST", headers={"X-Gridfleet-Token": "stack-token"})[0] == 403


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/nope",
        "/s/",
        "/s/bad name/",
        "/s/shop/extra",
        "/s/shop/?pages=2&page=3",
        "/s/shop/?page=0",
        "/s/shop/?page=-1",
    ],
)
def test_not_found(server, path):
    status, headers, _ = fetch(server.base_url + path.replace(" ", "%20"))
    assert status == 404
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert server.stats() == {"sites": {}}


@pytest.mark.parametrize(
    "query, param",
    [
        ("pages=abc", "pages"),
        ("pages=0", "pages"),
        ("pages=", "pages"),
        ("page=abc", "page"),
        ("delay_s=-1", "delay_s"),
        ("delay_s=nan", "delay_s"),
        ("hang_page=x", "hang_page"),
        ("hang_attempts=-1", "hang_attempts"),
        ("fail_attempts=1.5", "fail_attempts"),
        ("status=200", "status"),
        ("status=600", "status"),
        ("retry_after=-1", "retry_after"),
        ("challenge=2", "challenge"),
        ("items=101", "items"),
    ],
)
def test_bad_params_are_rejected(server, query, param):
    status, _, body = fetch(f"{server.base_url}/s/shop/?{query}")
    assert status == 400
    assert param.encode() in body
    assert server.stats() == {"sites": {}}


def test_stop_releases_hung_requests_promptly():
    srv = DemoServer().start()
    host, port = urlsplit(srv.base_url).netloc.split(":")
    conns = []
    try:
        for _ in range(2):
            conn = http.client.HTTPConnection(host, int(port), timeout=0.5)
            conn.request("GET", "/s/stuck/?hang_page=1")
            conns.append(conn)
        for conn in conns:
            with pytest.raises(TimeoutError):
                conn.getresponse()
        assert srv.stats()["sites"]["stuck"]["hits"] == {"1": 2}

        start = time.monotonic()
        srv.stop()
        assert time.monotonic() - start < 2
        # the held connections are closed without a response
        for conn in conns:
            conn.sock.settimeout(2)
            assert conn.sock.recv(1) == b""
        srv.stop()  # idempotent
    finally:
        for conn in conns:
            conn.close()
        srv.stop()


def test_stop_without_start_and_base_url_before_start():
    srv = DemoServer()
    with pytest.raises(RuntimeError):
        _ = srv.base_url
    srv.stop()
    srv.stop()


def test_main_serves_until_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedded.demo_server", "--port", "0"],
        cwd=REPO,
        env={**os.environ, "GRIDFLEET_STACK_TOKEN": "from-the-stack"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(r"demo server on (http://127\.0\.0\.1:\d+)\n", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        status, p = page(f"{match.group(1)}/s/cli/")
        assert status == 200
        assert p.item_ids[0] == "cli-1-1"
        reset = f"{match.group(1)}/_reset"
        assert fetch(reset, "POST", headers={"X-Gridfleet-Token": "from-the-stack"})[0] == 200  # the stack's token
        assert fetch(reset, "POST", headers={"X-Gridfleet-Token": "another"})[0] == 403

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# --- the JSON API -----------------------------------------------------------------


def api(url: str, timeout: float = 5) -> tuple[int, http.client.HTTPMessage, dict]:
    status, headers, body = fetch(url, timeout=timeout)
    assert headers["Content-Type"] == "application/json"
    return status, headers, json.loads(body)


def api_items(site: str, page_no: int, per_page: int = 10) -> list[dict[str, str]]:
    ids = [f"{site}-{page_no}-{i}" for i in range(1, per_page + 1)]
    return [{"id": item_id, "title": f"Item {item_id}"} for item_id in ids]


def test_api_walks_all_pages_by_following_tokens(server):
    url = f"{server.base_url}/api/shop?pages=3&delay_s=0"
    seen = []
    status, headers, body = api(url)
    while True:
        assert status == 200
        assert int(headers["Content-Length"]) > 0
        assert body["site"] == "shop"
        assert body["items"] == api_items("shop", body["page"])
        seen.append(body["page"])
        if body["next"] is None:
            break
        assert isinstance(body["next"], str) and "shop" not in body["next"]  # opaque
        status, headers, body = api(f"{url}&{urlencode({'token': body['next']})}")
    assert seen == [1, 2, 3]

    # the HTML pages of the same site carry the same ids
    _, html_page = page(f"{server.base_url}/s/shop/?pages=3")
    assert html_page.item_ids == [item["id"] for item in api_items("shop", 1)]

    status, _, single = api(f"{server.base_url}/api/solo")
    assert status == 200
    assert (single["page"], single["next"]) == (1, None)
    assert single["items"] == api_items("solo", 1)


def test_api_per_page(server):
    status, _, body = api(f"{server.base_url}/api/wide?pages=2&per_page=3")
    assert status == 200
    assert body["items"] == api_items("wide", 1, per_page=3)
    url = f"{server.base_url}/api/wide?pages=2&per_page=100&{urlencode({'token': body['next']})}"
    status, _, body = api(url)
    assert status == 200
    assert body["page"] == 2
    assert body["items"] == api_items("wide", 2, per_page=100)
    assert body["next"] is None


def test_api_rejects_forged_and_foreign_tokens(server):
    _, _, a1 = api(f"{server.base_url}/api/a?pages=3")
    token = a1["next"]
    body, _, sig = token.partition(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert payload == {"site": "a", "page": 2}
    forged_payload = json.dumps({"site": "a", "page": 3}, separators=(",", ":")).encode()
    forged_body = base64.urlsafe_b64encode(forged_payload).rstrip(b"=").decode()
    with DemoServer() as other:
        _, _, elsewhere = api(f"{other.base_url}/api/a?pages=3")
    bad_tokens = {
        "another site's": ("b", token),
        "forged": ("a", f"{forged_body}.{sig}"),
        "another server's": ("a", elsewhere["next"]),
        "garbage": ("a", "not-a-token"),
        "empty": ("a", ""),
    }
    for what, (site, bad) in bad_tokens.items():
        status, _, answer = api(f"{server.base_url}/api/{site}?pages=3&{urlencode({'token': bad})}")
        assert (status, answer) == (400, {"error": "bad token"}), what

    status, _, a2 = api(f"{server.base_url}/api/a?pages=3&{urlencode({'token': token})}")
    assert status == 200 and a2["page"] == 2
    # rejected requests are not counted
    sites = server.stats()["sites"]
    assert list(sites) == ["a"]
    assert sites["a"]["hits"] == {"1": 1, "2": 1}


def test_api_token_beyond_pages_is_not_found(server):
    _, _, p1 = api(f"{server.base_url}/api/shrink?pages=2")
    status, _, body = api(f"{server.base_url}/api/shrink?pages=1&{urlencode({'token': p1['next']})}")
    assert status == 404
    assert body == {"error": "shrink has no page 2"}
    assert server.stats()["sites"]["shrink"]["hits"] == {"1": 1}


def test_api_requests_count_in_stats_with_html_pages(server):
    before = time.time()
    _, _, p1 = api(f"{server.base_url}/api/mixed?pages=2")
    api(f"{server.base_url}/api/mixed?pages=2&{urlencode({'token': p1['next']})}")
    fetch(f"{server.base_url}/s/mixed/?pages=2")
    after = time.time()

    _, _, stats = api(f"{server.base_url}/_stats")
    mixed = stats["sites"]["mixed"]
    assert mixed["hits"] == {"1": 2, "2": 1}
    assert [p for _, p in mixed["requests"]] == [1, 2, 1]  # the API's page 2 is the page its token stands for
    assert len(mixed["times"]) == 3
    assert mixed["times"] == sorted(mixed["times"])
    assert all(before <= t <= after for t in mixed["times"])


def test_api_delay_is_honoured(server):
    start = time.monotonic()
    status, _, _ = api(f"{server.base_url}/api/slow?delay_s=0.2")
    assert status == 200
    assert time.monotonic() - start >= 0.2


def test_api_hang_page_hangs_only_the_first_attempts(server):
    url = f"{server.base_url}/api/sticky?pages=3&hang_page=2&hang_attempts=1"
    status, _, p1 = api(url)  # page 1 is not affected
    assert status == 200
    page2 = f"{url}&{urlencode({'token': p1['next']})}"
    with pytest.raises(TimeoutError):
        fetch(page2, timeout=0.5)

    status, _, p2 = api(page2)
    assert status == 200
    assert p2["page"] == 2
    assert p2["items"][0]["id"] == "sticky-2-1"
    assert server.stats()["sites"]["sticky"]["hits"] == {"1": 1, "2": 2}


def test_api_fail_attempts_fail_page_one_then_recover(server):
    url = f"{server.base_url}/api/flaky?pages=2&fail_attempts=1"
    status, _, body = api(url)
    assert status == 500
    assert body == {"error": "flaky failed on purpose (attempt 1)"}
    status, _, body = api(url)
    assert status == 200
    assert body["items"] == api_items("flaky", 1)
    assert api(f"{url}&{urlencode({'token': body['next']})}")[0] == 200


def test_api_bad_params_are_rejected(server):
    cases = [
        ("pages=abc", "pages"),
        ("pages=0", "pages"),
        ("per_page=0", "per_page"),
        ("per_page=101", "per_page"),
        ("per_page=x", "per_page"),
        ("page=2", "page"),  # the API pages by token
        ("delay_s=-1", "delay_s"),
        ("delay_s=inf", "delay_s"),
        ("hang_page=x", "hang_page"),
        ("hang_attempts=-1", "hang_attempts"),
        ("fail_attempts=1.5", "fail_attempts"),
    ]
    for query, param in cases:
        status, _, body = api(f"{server.base_url}/api/shop?{query}")
        assert (status, body) == (400, {"error": f"bad value for {param}"}), query
    assert server.stats() == {"sites": {}}


def test_a_site_can_answer_a_status_a_challenge_or_fewer_items(server):
    status, headers, body = fetch(f"{server.base_url}/s/gone/?pages=2&status=404")
    assert status == 404 and headers.get("Retry-After") is None
    status, headers, body = fetch(f"{server.base_url}/s/busy/?status=503&retry_after=7")
    assert status == 503 and headers["Retry-After"] == "7"
    status, _, body = fetch(f"{server.base_url}/s/walled/?status=403")
    assert status == 403 and b"Access denied" in body
    status, p = page(f"{server.base_url}/s/checked/?challenge=1")
    assert status == 200 and p.title == "Just a moment..." and p.item_ids == []
    status, p = page(f"{server.base_url}/s/thin/?pages=2&items=2")
    assert status == 200 and len(p.item_ids) == 2 and p.next_hrefs
    status, p = page(f"{server.base_url}/s/empty/?items=0")
    assert status == 200 and p.item_ids == []
