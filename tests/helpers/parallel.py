"""How a parallel run (pytest-xdist, `--dist loadgroup`) shares the tests out: each test alone, but for the
groups below, whose tests go to one worker, one after another.

The groups are named here by where their tests are, not by xdist's `xdist_group` mark: the controller hands
out tests by their ids, and pytest-xdist 3.8 carries a mark's group to it by appending it to the id in a way
pytest 9 no longer reads, so the mark alone groups nothing.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

#: A test whose id starts with a key (a path relative to the root, `::` and a name to pick tests in a file)
#: belongs to that group. The first key that matches wins.
GROUPS: dict[str, str] = {
    # The twin's tests share the run's twin network (its bridge, and the namespaces `twin_ok` removes when it
    # starts), the day and the week share one deployed stack (`twin_stack`, made once per worker that asks for
    # it), and a twin's instances are whole machines' worth of processes, too many beside another twin's on
    # two cores.
    "tests/twin/": "twin",
    # Both use the module's bundle built for graviton (a minute of pip): built once, not once per worker.
    "tests/adapter/test_bundle.py::test_a_bundle_built_here_for_graviton": "graviton-bundle",
    "tests/adapter/test_bundle.py::test_the_upload_tags_the_bundle_with_its_target": "graviton-bundle",
    # The module's tests read the calls of every role's code, recorded once for the module (a minute).
    "tests/infra/test_iam.py::": "iam-recorded",
}


def group_of(nodeid: str) -> str | None:
    return next((group for prefix, group in GROUPS.items() if nodeid.startswith(prefix)), None)


class GroupScheduling(LoadScopeScheduling):
    """xdist's load scheduling by scopes, a scope being a group of `GROUPS` or else a single test. The
    scopes are handed out biggest first (xdist's reordering of scopes), so the twin's group starts at once."""

    def _split_scope(self, nodeid: str) -> str:
        group = group_of(nodeid)
        return f"group:{group}" if group else nodeid


def make_scheduler(config: pytest.Config, log: object) -> GroupScheduling:
    return GroupScheduling(config, log)  # type: ignore[arg-type]
