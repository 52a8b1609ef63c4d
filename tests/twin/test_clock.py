"""The twin's clock: jumps, what an instance booted after one sees, and the preload library that moves an
instance's wall clock (real processes: date, bash, python3, a user change; no root needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from twin.instance.sandbox import CLOCK_LIB
from twin.stack import FAKE_CLOCK_FROM_S, TwinClock

DAY = 86400.0


def test_a_jump_moves_the_twin_and_only_a_day_sized_one_moves_the_instances():
    clock = TwinClock()
    clock.jump(time.time() + 90)  # to a watchdog pass: skew, not the instances' business
    assert 89 < clock.offset < 91 and clock.instance_offset == 0.0
    clock.jump(clock.now() + DAY)
    assert DAY + 89 < clock.instance_offset == clock.offset < DAY + 91
    before = clock.offset
    clock.jump(clock.now() - 3600)  # never back
    assert clock.offset == before
    assert TwinClock(FAKE_CLOCK_FROM_S).instance_offset == FAKE_CLOCK_FROM_S


needs_lib = pytest.mark.skipif(not CLOCK_LIB.is_file(), reason=f"{CLOCK_LIB} is built by `make setup`")


@pytest.fixture
def shifted(open_dir):
    """`shifted(argv, offset)`: argv's output with its wall clock `offset` seconds ahead. The library is copied where
    every user can read it, as an instance has its copy: the checkout may be closed to all but its owner, and a
    process that changed user must still load it."""
    lib = open_dir / "clockshift.so"
    shutil.copyfile(CLOCK_LIB, lib)
    lib.chmod(0o644)

    def run(argv: list[str], offset: float) -> str:
        env = {**os.environ, "LD_PRELOAD": str(lib), "GRIDFLEET_TWIN_CLOCK_OFFSET": str(offset)}
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=30).stdout

    return run


@needs_lib
def test_the_preload_moves_the_wall_clock_of_every_process_and_leaves_the_monotonic_one(shifted):
    now = time.time()
    assert abs(int(shifted(["date", "+%s"], 2 * DAY)) - (now + 2 * DAY)) < 5
    out = shifted(["bash", "-c", "echo $EPOCHSECONDS; sleep 0.3; echo $SECONDS"], DAY).split()
    assert abs(int(out[0]) - (now + DAY)) < 5 and out[1] in ("0", "1")
    code = "import time; m = time.monotonic(); time.sleep(0.2); print(time.time(), time.monotonic() - m)"
    wall, slept = map(float, shifted([sys.executable, "-c", code], DAY).split())
    assert abs(wall - (now + DAY)) < 5 and 0.15 < slept < 2  # sleeps are this machine's
    if os.geteuid() == 0:  # a child that changes user keeps the clock (no state shared between processes)
        who = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "date", "+%s"]
        assert abs(int(shifted(who, DAY)) - (now + DAY)) < 5
