"""The EC2 instance id rule (fleet.record.ids): what EC2 issues passes, anything else is refused, matched whole."""

from __future__ import annotations

import pytest

from fleet.record.ids import check_instance_id, is_instance_id


@pytest.mark.parametrize("iid", ["i-0123abcd", "i-0123456789abcdef0"])
def test_the_two_forms_ec2_issues_pass(iid):
    assert is_instance_id(iid) and check_instance_id(iid) == iid


@pytest.mark.parametrize(
    "bad",
    ["", "i-", "i-1", "i-0123abc", "i-0123456789abcdef", "i-0123456789ABCDEF0", "i-0123abcd\n", "x-0123abcd", None],
)
def test_anything_else_is_refused_naming_it(bad):
    assert not is_instance_id(bad)
    with pytest.raises(ValueError, match="instance id from EC2 .* is not an EC2 instance id"):
        check_instance_id(bad, "instance id from EC2")
