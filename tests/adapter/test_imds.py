"""IMDSv2 client and spot watcher against the metadata emulator on 127.0.0.1."""

from __future__ import annotations

import pytest

from embedded.imds_server import ImdsServer
from fleet.aws.imds import Imds, ImdsError
from fleet.clock import FakeClock
from node.spot import SpotWatcher


@pytest.fixture
def imds():
    with ImdsServer() as server:
        yield server


def test_every_get_carries_a_session_token(imds):
    imds.set("i-0abc", local_ipv4="10.0.1.7", tags={"gridfleet:run_id": "2026-11-21"})
    c = Imds(imds.base_url("i-0abc"))
    assert c.instance_id() == "i-0abc" and c.local_ipv4() == "10.0.1.7"
    assert c.tag("gridfleet:run_id") == "2026-11-21" and c.tag("other") is None
    assert c.spot_action() is None
    assert imds.state.requests and all(ok for _, _, ok in imds.state.requests)


def test_a_tokenless_get_is_refused_by_the_emulator(imds):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(imds.base_url("i-1") + "/latest/meta-data/instance-id", timeout=2)
    assert e.value.code == 401


def test_no_metadata_service_is_an_imds_error():
    with pytest.raises(ImdsError):
        Imds("http://127.0.0.1:9", timeout_s=0.5).instance_id()


def test_spot_watcher_polls_at_most_every_interval_and_remembers_the_notice(imds):
    clock = FakeClock()
    watcher = SpotWatcher(Imds(imds.base_url("i-1")), clock, interval_s=5)
    assert watcher.notice() is None
    imds.spot_notice("i-1")
    assert watcher.notice() is None  # not looked again yet: 5 s have not passed
    polls = len(imds.state.requests)
    clock.advance(5)
    notice = watcher.notice()
    assert notice["action"] == "terminate" and "time" in notice
    assert len(imds.state.requests) == polls + 1
    clock.advance(60)
    assert watcher.notice() == notice and len(imds.state.requests) == polls + 1  # sticky, no more calls


def test_spot_watcher_survives_a_missing_metadata_service():
    watcher = SpotWatcher(Imds("http://127.0.0.1:9", timeout_s=0.2), FakeClock())
    assert watcher.notice() is None


def post(url: str, method: str = "POST", headers: dict[str, str] | None = None) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, method=method, data=b"" if method in ("POST", "PUT") else None, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        with e:
            return e.code


def test_a_spot_notice_over_http_needs_the_stacks_token_and_a_post():
    with ImdsServer(token="stack-token") as imds:
        url = f"{imds.url}/_spot/i-1"
        assert post(url) == 403
        assert post(url, headers={"X-Gridfleet-Token": "guess"}) == 403
        assert post(url, "GET", headers={"X-Gridfleet-Token": "stack-token"}) == 405
        assert post(url, "PUT", headers={"X-Gridfleet-Token": "stack-token"}) == 405
        client = Imds(imds.base_url("i-1"))
        assert client.spot_action() is None  # none of those posted a notice
        assert post(url, headers={"X-Gridfleet-Token": "stack-token"}) == 200
        assert client.spot_action()["action"] == "terminate"
        assert Imds(imds.base_url("i-2")).spot_action() is None  # for that instance only
