"""What a twin day that does not end says of its instances' processes (`twin.instance.network.describe`)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.wait import wait_for
from twin.instance import network


def test_a_process_is_described_by_its_state_what_it_waits_in_and_its_command_line():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        asleep = lambda: "time.sleep" in network.describe(child.pid) and network.describe(child.pid).split()[1] == "S"  # noqa: E731
        wait_for(asleep, 30)
        pid, state, wchan, *argv = network.describe(child.pid).split()
        assert (int(pid), state) == (child.pid, "S") and wchan != "-"
        assert argv == [sys.executable, "-c", "import", "time;", "time.sleep(60)"]
    finally:
        child.kill()
        child.wait()
    assert network.describe(child.pid) == f"{child.pid} (gone)"
    assert network.describe(os.getpid()).split()[1] == "R"  # this process, reading it
