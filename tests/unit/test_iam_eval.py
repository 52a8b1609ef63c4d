"""The tests' IAM evaluator (tests/helpers/iam_eval.py) decides as AWS documents: an explicit Deny wins, wildcards
are IAM's, and each condition operator the stack uses holds as IAM's do."""

from __future__ import annotations

import pytest

from tests.helpers.iam_eval import (
    ALLOW,
    DENY,
    IMPLICIT_DENY,
    Condition,
    Request,
    Statement,
    decide,
    dynamodb_context,
)

TABLE = "arn:aws:dynamodb:r:1:table/t"


def allow(*conditions: Condition, action: str = "dynamodb:UpdateItem", resource: str = TABLE) -> Statement:
    return Statement("Allow", (action,), (resource,), conditions)


def test_wildcards_and_an_explicit_deny():
    st = allow(action="s3:Get*", resource="arn:aws:s3:::b/*/result.json")
    assert decide([st], Request("s3:getobject", "arn:aws:s3:::b/a/1/result.json")) == ALLOW
    assert decide([st], Request("s3:GetObject", "arn:aws:s3:::b/a/1/result.JSON")) == IMPLICIT_DENY
    deny = Statement("Deny", ("*",), ("*",), (Condition("Bool", "aws:SecureTransport", ("false",)),))
    assert (
        decide([st, deny], Request("s3:GetObject", "arn:aws:s3:::b/a/result.json", {"aws:SecureTransport": "false"}))
        == DENY
    )


def test_for_all_values_holds_for_an_absent_key_so_null_stands_beside_it():
    only = Condition("ForAllValues:StringEquals", "dynamodb:Attributes", ("run_id", "Site", "version"))
    present = Condition("Null", "dynamodb:Attributes", ("false",))
    assert decide([allow(only)], Request("dynamodb:UpdateItem", TABLE, {})) == ALLOW
    assert decide([allow(only, present)], Request("dynamodb:UpdateItem", TABLE, {})) == IMPLICIT_DENY
    ok = {"dynamodb:Attributes": ("Site", "run_id", "version")}
    assert decide([allow(only, present)], Request("dynamodb:UpdateItem", TABLE, ok)) == ALLOW
    extra = {"dynamodb:Attributes": ("Site", "run_id", "spec")}
    assert decide([allow(only, present)], Request("dynamodb:UpdateItem", TABLE, extra)) == IMPLICIT_DENY


def test_if_exists_string_like_and_an_unknown_operator():
    rv = allow(Condition("StringEqualsIfExists", "dynamodb:ReturnValues", ("NONE",)))
    assert decide([rv], Request("dynamodb:UpdateItem", TABLE, {})) == ALLOW
    assert decide([rv], Request("dynamodb:UpdateItem", TABLE, {"dynamodb:ReturnValues": "ALL_NEW"})) == IMPLICIT_DENY
    like = allow(Condition("StringLike", "s3:prefix", ("a/*",)))
    assert decide([like], Request("dynamodb:UpdateItem", TABLE, {"s3:prefix": "a/b"})) == ALLOW
    assert decide([like], Request("dynamodb:UpdateItem", TABLE, {})) == IMPLICIT_DENY
    with pytest.raises(ValueError, match="NumericLessThan"):
        decide([allow(Condition("NumericLessThan", "x", ("1",)))], Request("dynamodb:UpdateItem", TABLE, {"x": "0"}))


def test_the_context_of_an_update_names_every_attribute_it_touches():
    ctx = dynamodb_context(
        {
            "Key": {"run_id": {"S": "r"}, "Site": {"S": "a"}},
            "UpdateExpression": "SET #a = :a, next_at = next_at + :s REMOVE #b",
            "ConditionExpression": "attribute_not_exists(#c) OR version = :v",
            "ExpressionAttributeNames": {"#a": "pages", "#b": "kill_reason", "#c": "instance_id"},
            "ReturnValues": "UPDATED_NEW",
        }
    )
    assert ctx == {
        "dynamodb:Attributes": ("Site", "instance_id", "kill_reason", "next_at", "pages", "run_id", "version"),
        "dynamodb:LeadingKeys": ("r",),
        "dynamodb:ReturnValues": "UPDATED_NEW",
    }
