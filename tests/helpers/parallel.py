"""How the suite runs in parallel (pytest-xdist, `--dist loadgroup`, as `make test` runs it), and how two runs
of it share one machine.

The EC2 twin's tests run on a worker of their own, which runs nothing else: the twin changes moto's answers for
the whole process (quotas, account settings, service-linked roles, what SSM and IAM allow), and one of its tests
resets moto's state (`mock_aws`), so an adapter test after them, or a module's fixture made before them, in the
same process would see another AWS. (Run one after another, the suite's order keeps the twin's tests after the
others.)

Each process that runs tests takes an EC2 twin network of its own (`GRIDFLEET_TWIN_NET`), held by a lock for
as long as it runs: the twin tests remove what they find of their network's namespaces, veths and bridge (a
crashed run's), which would take down a twin of another run of the suite on the same network.

The other tests are handed out one by one, but for the groups below, each of which goes to one worker whole.
The groups are named here by where their tests are, not by xdist's `xdist_group` mark: the controller hands
out tests by their ids, and pytest-xdist 3.8 carries a mark's group to it by appending it to the id in a way
pytest 9 no longer reads, so the mark alone groups nothing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: The twin networks runs of the suite take: 1 to 9. Network 0, the default, is left to twins started by hand
#: (`bench/boot.py`, `gridfleet twin`), which take no lock.
SUITE_TWIN_NETS = range(1, 10)

#: A test whose id starts with a key (a path from the root, with `::` and a name to pick tests of a file)
#: belongs to that group; the first key that matches wins.
GROUPS: dict[str, str] = {
    # The day, the lost hub and the week run on one deployed stack (`twin_stack`, a session fixture: once per worker).
    "tests/twin/test_twin_day.py::": "twin-stack",
    "tests/twin/test_twin_hub_lost.py::": "twin-stack",
    "tests/twin/test_twin_week.py::": "twin-stack",
    # Both use the module's bundle built for graviton (a minute of pip): built once, not once per worker.
    "tests/adapter/test_bundle.py::test_a_bundle_built_here_for_graviton": "graviton-bundle",
    "tests/adapter/test_bundle.py::test_the_upload_tags_the_bundle_with_its_target": "graviton-bundle",
    "tests/adapter/test_bundle.py::test_upload_built_": "graviton-bundle",
    # The module's tests read the calls of every role's code, recorded once for the module (a minute).
    "tests/infra/test_iam.py::": "iam-recorded",
    # These read the stack as Terraform applies it to moto (`applied`, a session fixture: once per worker, seconds
    # of CPU each time): applied once.
    "tests/infra/test_logs.py::": "infra-applied",
    "tests/infra/test_node_powers.py::": "infra-applied",
    "tests/infra/test_parliament.py::": "infra-applied",
    # Each of these modules makes something that costs seconds of CPU once for the module (Debian's package
    # index read, a stack applied or a moto server set up): its tests go to one worker, which makes it once,
    # where handed out one by one they made it once per worker.
    "tests/unit/test_debian_index.py::": "debian-index",
    "tests/adapter/test_twin_infra.py::": "twin-infra",
    "tests/adapter/test_preflight.py::": "preflight",
    "tests/adapter/test_cli_aws_failures.py::": "cli-aws-failures",
    "tests/adapter/test_lambdas.py::": "lambdas",
    "tests/adapter/test_ec2_adapter.py::": "ec2-adapter",
    "tests/adapter/test_ec2_provider.py::": "ec2-provider",
    "tests/adapter/test_aws_run.py::": "aws-run",
    "tests/infra/test_docs_site.py::": "docs-site",  # the site, built with Sphinx once for the module
}
#: The twin's tests: on a worker of their own (see above).
TWIN = "tests/twin/"

#: The order workers are handed tests in: the long ones first (the twin's, then the browser tests, then the
#: rest), so that no worker starts a minutes-long test when the others are about to end.
FIRST = ("tests/twin/", "tests/e2e/", "examples/", "tests/infra/", "tests/faults/", "tests/adapter/")


def runs_tests(config: pytest.Config) -> bool:
    """False in the controller of a parallel run, which hands tests out to its workers and runs none."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    return config.getoption("dist", "no") == "no" or not config.getoption("tx", None)


def claim_twin_net() -> tuple[int, int]:
    """The first twin network no other process of the suite on this machine holds, and the descriptor of the
    lock that holds it (an flock, released when this process ends, however it ends)."""
    for net in SUITE_TWIN_NETS:
        fd = os.open(Path(tempfile.gettempdir()) / f"gridfleet-twin-net-{net}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return net, fd
    nets = f"{SUITE_TWIN_NETS.start}-{SUITE_TWIN_NETS.stop - 1}"
    raise pytest.UsageError(f"every twin network ({nets}) is held by another run of the suite; set GRIDFLEET_TWIN_NET")


def group_of(nodeid: str) -> str | None:
    return next((group for prefix, group in GROUPS.items() if nodeid.startswith(prefix)), None)


def rank(where: str) -> int:
    """Where a test (its path from the root) comes in the order of `FIRST`."""
    return next((n for n, top in enumerate(FIRST) if where.startswith(top)), len(FIRST))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load scheduling by scopes, a scope being a group of `GROUPS` or else a single test, biggest first
    (xdist's reordering of scopes), so every group starts at once; the twin's scopes all go to the first worker
    that takes one of them, in the suite's order, and that worker takes nothing else from then on (with two
    workers or more)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        twin_node: Any = None

        def _split_scope(self, nodeid: str) -> str:
            group = group_of(nodeid)
            return f"group:{group}" if group else nodeid

        def _is_twin(self, scope: str) -> bool:
            return scope.startswith(TWIN) or scope == "group:twin-stack"

        def _may_take(self, node: Any, scope: str) -> bool:
            if len(self.nodes) < 2:
                return True
            if self._is_twin(scope):
                return self.twin_node is None or self.twin_node is node
            return node is not self.twin_node

        def _assign_work_unit(self, node: Any) -> None:
            scope = next((s for s in self.workqueue if self._may_take(node, s)), None)
            if scope is None:
                return
            if self._is_twin(scope):
                # the twin's worker runs them one after another, whatever their order: it keeps the suite's own
                # (the day and the week, on the stack they share, after the twin's other tests, as a serial run)
                collection = self.registered_collections[node]
                twin = [s for s in self.workqueue if self._is_twin(s)]
                scope = min(twin, key=lambda s: min(collection.index(n) for n in self.workqueue[s]))
                self.twin_node = node
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if not any(self._may_take(node, s) for s in self.workqueue):
                node.shutdown()  # it ends the tests it was given, then stops
                return
            if self._pending_of(self.assigned_work[node]) > 2:
                return
            self._assign_work_unit(node)

        def remove_node(self, node: Any) -> Any:
            if node is self.twin_node:
                self.twin_node = None  # the twin's tests it had go back to the queue, for another worker
            return super().remove_node(node)

    return GroupScheduling(config, log)
