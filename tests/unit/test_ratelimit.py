"""Fleet-wide rate limits: the in-memory limiter's slots, and the rate_limits config."""

from __future__ import annotations

import textwrap
import threading
from itertools import pairwise

import pytest

from fleet.aws.ratelimit import MAX_LATE, PACE_MARGIN, MemoryRateLimiter, spacing
from fleet.clock import FakeClock
from fleet.config.load import dump_config, parse_config
from fleet.errors import ConfigError
from tests.helpers.windows import max_in_window


def test_max_in_window_counts_closed_windows():
    assert max_in_window([0.0, 0.5, 1.0, 1.5]) == 3
    assert max_in_window([0.0, 1.01, 2.02]) == 1


def test_spacing_has_the_pacing_margin():
    assert spacing(5) == pytest.approx(PACE_MARGIN / 5) == pytest.approx(0.22)
    with pytest.raises(ValueError):
        spacing(0)


def test_an_idle_group_gives_its_slot_now():
    clock = FakeClock()
    rl = MemoryRateLimiter(clock)
    assert rl.take("news", 5, clock.now()) == clock.now()
    clock.advance(10)  # long idle: the next request goes at once, without waiting for a stale schedule
    assert rl.take("news", 5, clock.now()) == clock.now()


def test_slots_under_contention_are_exactly_spacing_apart():
    clock = FakeClock()
    rl = MemoryRateLimiter(clock)
    t0 = clock.now()
    slots = [rl.take("news", 5, t0) for _ in range(20)]  # 20 requests at the same instant
    assert slots == [pytest.approx(t0 + i * spacing(5)) for i in range(20)]
    assert max_in_window(slots) == 5


def test_groups_are_independent():
    clock = FakeClock()
    rl = MemoryRateLimiter(clock)
    t0 = clock.now()
    rl.take("news", 5, t0)
    assert rl.take("shop", 5, t0) == t0
    assert rl.take("news", 5, t0) == pytest.approx(t0 + spacing(5))


def test_threads_contending_get_distinct_paced_slots():
    clock = FakeClock()
    rl = MemoryRateLimiter(clock)
    t0 = clock.now()
    slots: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = [rl.take("news", 10, t0) for _ in range(50)]
        with lock:
            slots.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = sorted(slots)
    assert ordered == [pytest.approx(t0 + i * spacing(10)) for i in range(200)]
    assert max_in_window(slots) <= 10


def test_wait_sleeps_until_the_slot():
    clock = FakeClock()
    rl = MemoryRateLimiter(clock)
    t0 = clock.now()
    sends = []
    for _ in range(6):
        slot = rl.wait("news", 5)
        assert clock.now() == pytest.approx(slot)
        sends.append(clock.now())
    assert sends == [pytest.approx(t0 + i * 0.22) for i in range(6)]


def test_no_burst_after_idleness():
    """A group idle for a while has no 'saved up' budget: requests resume at the pace, not in a burst."""
    clock = FakeClock()
    rl = MemoryRateLimiter(clock)
    sends: list[float] = []
    for _ in range(10):
        sends.append(rl.wait("news", 5))
    clock.advance(30)  # idle
    for _ in range(3):  # three nodes ask at the same instant after the pause
        sends.append(rl.take("news", 5, clock.now()))
    for _ in range(10):
        sends.append(rl.wait("news", 5))
    assert max_in_window(sends) <= 5
    gaps = [b - a for a, b in pairwise(sorted(sends))]
    assert min(gaps) >= spacing(5) - 1e-9


class SlowTable(MemoryRateLimiter):
    """Slots as the table gives them, each answer `latency` seconds late (a loaded node or table)."""

    def __init__(self, clock: FakeClock, latency: list[float]):
        super().__init__(clock)
        self.latency = latency

    def take(self, group: str, per_s: float, now: float) -> float:
        slot = super().take(group, per_s, now)
        self.clock.advance(self.latency.pop(0) if self.latency else 0.0)
        return slot


def test_a_request_late_for_its_slot_takes_another():
    """The first answer comes 0.15 s after its slot (now, the group idle): leaving then, and the sixth
    request at its own slot 1.1 s later, would put six requests into one second. It takes the next slot."""
    clock = FakeClock()
    rl = SlowTable(clock, [0.15])
    t0 = clock.now()
    sends = []
    for _ in range(6):
        rl.wait("news", 5)
        sends.append(clock.now())
    assert sends[0] == pytest.approx(t0 + spacing(5))  # the slot at t0 went unused
    assert max_in_window(sends) <= 5 and all(b - a >= spacing(5) - 1e-9 for a, b in pairwise(sends))


def test_a_request_late_again_and_again_goes_after_max_late_tries():
    clock = FakeClock()
    rl = SlowTable(clock, [1.0] * 10)
    rl.wait("news", 5)
    assert len(rl.latency) == 10 - MAX_LATE  # bounded: it took MAX_LATE slots, then went


def test_slow_requests_are_not_delayed():
    """Requests rarer than the limit are never held back."""
    clock = FakeClock()
    rl = MemoryRateLimiter(clock)
    for _ in range(5):
        now = clock.now()
        assert rl.wait("news", 5) == now
        clock.advance(1.0)  # the request itself takes a second


# --- config -----------------------------------------------------------------------------------------------------------


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(textwrap.dedent(text), "fleet.yaml")
    return [str(p) for p in e.value.problems]


def test_rate_limits_config_loads():
    c = parse_config(
        textwrap.dedent("""\
        rate_limits:
          news: {per_s: 5}
          shop.kr: {per_s: 0.5}
        sites:
          - {id: a, start_url: 'http://a.test', rate_limit: news}
          - {id: b, start_url: 'http://b.test', rate_limit: news}
          - {id: c, start_url: 'http://c.test'}
        """),
        "fleet.yaml",
    )
    assert c.rate_limits["news"].per_s == 5 and c.rate_limits["shop.kr"].per_s == 0.5
    assert [s.rate_limit for s in c.sites] == ["news", "news", None]
    assert parse_config(dump_config(c)) == c


def test_no_rate_limits_is_the_default():
    c = parse_config("sites: [{id: a, start_url: 'http://a.test'}]", "fleet.yaml")
    assert c.rate_limits == {} and c.sites[0].rate_limit is None


def test_unknown_group_is_one_clear_error():
    (p,) = problems("""\
        rate_limits: {news: {per_s: 5}, shop: {per_s: 2}}
        sites:
          - {id: a, start_url: 'http://a.test', rate_limit: news}
          - {id: b, start_url: 'http://b.test', rate_limit: nwes}
        """)
    assert p.startswith("fleet.yaml:")
    assert "sites[1] (id 'b')" in p and "rate_limit 'nwes'" in p and "(defined: news, shop)" in p


def test_unknown_group_without_any_groups():
    (p,) = problems("sites: [{id: a, start_url: 'http://a.test', rate_limit: news}]")
    assert "id 'a'" in p and "rate_limit 'news'" in p and "(defined: none)" in p


@pytest.mark.parametrize("per_s", [0, -1])
def test_per_s_must_be_positive(per_s):
    (p,) = problems(f"""\
        rate_limits:
          news: {{per_s: {per_s}}}
        sites: [{{id: a, start_url: 'http://a.test', rate_limit: news}}]
        """)
    assert p.startswith("fleet.yaml:2: rate_limits.news.per_s: Input should be greater than 0"), p


def test_per_s_is_required_and_keys_are_checked():
    found = problems("""\
        rate_limits:
          news: {rate: 5}
        sites: [{id: a, start_url: 'http://a.test', rate_limit: news}]
        """)
    assert "fleet.yaml:2: rate_limits.news.per_s: required key is missing" in found
    assert "fleet.yaml:2: rate_limits.news.rate: unknown key 'rate'" in found


def test_group_names_follow_the_site_id_rule():
    (p,) = problems("""\
        rate_limits:
          'news/kr': {per_s: 5}
        sites: [{id: a, start_url: 'http://a.test'}]
        """)
    assert p.startswith("fleet.yaml:1: rate_limits: group name 'news/kr' is not valid: letters, digits"), p
