"""The virtual-time scheduler: actors interleave by wake time, deterministically, and can be crashed."""

from tests.helpers.vclock import Crashed, VirtualClock


def test_actors_interleave_by_wake_time_and_time_jumps():
    clock = VirtualClock(start=0.0)
    log = []

    def ticker(name, period, n):
        def run():
            for _ in range(n):
                log.append((clock.now(), name))
                clock.sleep(period)

        return run

    clock.spawn("a", ticker("a", 3, 3))
    clock.spawn("b", ticker("b", 2, 4))
    clock.run()
    assert log == [(0, "a"), (0, "b"), (2, "b"), (3, "a"), (4, "b"), (6, "a"), (6, "b")]
    assert clock.now() == 9  # a slept once more after its last entry, until 9


def test_a_crashed_actor_stops_at_its_wait_and_its_cleanup_never_swallows_the_crash():
    clock = VirtualClock(start=0.0)
    seen = []

    def stubborn():
        while True:
            try:
                clock.sleep(1)
                seen.append(clock.now())
            except Exception:  # a loop that survives errors must still die when crashed
                seen.append("caught")

    victim = clock.spawn("victim", stubborn)

    def killer():
        clock.sleep(3.5)
        clock.crash(victim)

    clock.spawn("killer", killer)
    clock.run()
    assert seen == [1, 2, 3] and victim.done and victim.error is None
    assert issubclass(Crashed, BaseException) and not issubclass(Crashed, Exception)


def test_run_until_and_errors_are_kept():
    clock = VirtualClock(start=0.0)

    def slow():
        clock.sleep(100)

    def broken():
        raise ValueError("boom")

    s = clock.spawn("slow", slow)
    b = clock.spawn("broken", broken)
    clock.run(until=10)
    assert clock.now() == 10 and not s.done and isinstance(b.error, ValueError)
    clock.shutdown()
    assert s.done
