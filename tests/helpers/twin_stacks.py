"""A whole EC2 twin for a test module that needs one apart from the deployed stack (tests/twin)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def running_twin(prefix: str, region: str):
    """A whole twin (its AWS on the bridge, instances booting as launched) in a directory of its own, for a module
    that needs one apart from the deployed stack; stopped and removed at the end."""
    from twin.stack import TwinStack

    root = Path(tempfile.mkdtemp(prefix=prefix))
    stack = TwinStack(root, region=region, tick_s=0.2)
    try:
        stack.start().run()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)
