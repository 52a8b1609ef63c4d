"""A small IAM policy evaluator for the tests: moto evaluates no IAM, so what a role may do is decided here.

It takes a role's identity-policy statements (from the policy JSON the twin's apply resolves, or from the .tf text
as tests/infra/test_iam.py reads it) and one request: the IAM action, the resource's ARN and the request's condition
keys, as AWS would put them in the request context. An explicit Deny wins, then any Allow whose action, resource and
every condition match; otherwise the request is implicitly denied. Wildcards are IAM's (`*`, `?`); actions and
condition keys compare without case, resources and values with it. Only the condition operators the stack's
policies use are known (StringEquals, StringLike, ArnLike, their IfExists forms, ForAllValues:StringEquals and
StringNotLike, Null, Bool); any other raises, so a policy that grows one cannot pass here by being misread. A
resource's policy variables (`${aws:userid}`) take their values from the request's context.

What AWS puts in a request's context for the calls the node makes is built by `dynamodb_context` and `s3_context`
from the call's parameters, as botocore sends them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALLOW, DENY, IMPLICIT_DENY = "allow", "deny", "implicit-deny"

ContextValue = str | tuple[str, ...]


@dataclass(frozen=True)
class Condition:
    operator: str
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Statement:
    effect: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: tuple[Condition, ...] = ()
    sid: str = ""


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)


def _listed(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, list) else (str(v),)


def from_document(doc: Mapping[str, Any]) -> list[Statement]:
    """The statements of a policy document as AWS receives it (JSON: Effect, Action, Resource, Condition)."""
    out = []
    for st in doc["Statement"] if isinstance(doc["Statement"], list) else [doc["Statement"]]:
        conditions = tuple(
            Condition(op, key, _listed(values))
            for op, keys in (st.get("Condition") or {}).items()
            for key, values in keys.items()
        )
        out.append(
            Statement(
                st["Effect"], _listed(st["Action"]), _listed(st.get("Resource", "*")), conditions, st.get("Sid", "")
            )
        )
    return out


def _wildcard(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _matches(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    return _wildcard(pattern, ignore_case=ignore_case).fullmatch(value) is not None


def _context_value(context: Mapping[str, ContextValue], key: str) -> ContextValue | None:
    for k, v in context.items():
        if k.lower() == key.lower():
            return v
    return None


def _single(values: tuple[str, ...], value: ContextValue, like: bool) -> bool:
    found = (value,) if isinstance(value, str) else value
    return any((_matches(p, v) if like else p == v) for p in values for v in found)


def condition_holds(c: Condition, context: Mapping[str, ContextValue]) -> bool:
    value = _context_value(context, c.key)
    op = c.operator
    if op == "Null":
        (want,) = c.values
        return (value is None or value == ()) == (want.lower() == "true")
    if op.startswith("ForAllValues:"):
        inner = op.split(":", 1)[1]
        found = () if value is None else ((value,) if isinstance(value, str) else value)
        # an absent or empty key holds, as in AWS (hence Null beside it)
        if inner == "StringEquals":
            return all(v in c.values for v in found)
        if inner == "StringNotLike":  # each value matches none of the patterns
            return all(not any(_matches(p, v) for p in c.values) for v in found)
        raise ValueError(f"condition operator {op} is not known to this evaluator")
    base, if_exists = (op[: -len("IfExists")], True) if op.endswith("IfExists") else (op, False)
    if base not in ("StringEquals", "StringLike", "ArnLike", "Bool"):
        raise ValueError(f"condition operator {op} is not known to this evaluator")
    if value is None:
        return if_exists
    if base == "Bool":
        return _single(tuple(v.lower() for v in c.values), str(value).lower(), like=False)
    # ArnLike matches an ARN as StringLike does (its six parts' wildcards, here: none spans a part it should not)
    return _single(c.values, value, like=base in ("StringLike", "ArnLike"))


_VARIABLE = re.compile(r"\$\{(aws:[A-Za-z]+)\}")  # IAM's own: `${aws_...}` in the .tf text is Terraform's


def _resolved(pattern: str, context: Mapping[str, ContextValue]) -> str | None:
    """A resource pattern with its policy variables (`${aws:userid}`) put in from the request's context, as IAM
    does; None when one has no value there (IAM then takes the statement to match nothing)."""
    missing = False

    def value(m: re.Match[str]) -> str:
        nonlocal missing
        v = _context_value(context, m[1])
        if not isinstance(v, str):
            missing = True
            return ""
        return v  # (an aws:userid holds no wildcard character)

    out = _VARIABLE.sub(value, pattern)
    return None if missing else out


def _applies(st: Statement, r: Request) -> bool:
    resources = [p for p in (_resolved(p, r.context) for p in st.resources) if p is not None]
    return (
        any(_matches(a, r.action, ignore_case=True) for a in st.actions)
        and any(_matches(p, r.resource) for p in resources)
        and all(condition_holds(c, r.context) for c in st.conditions)
    )


def decide(statements: Iterable[Statement], request: Request) -> str:
    """ALLOW, DENY (an explicit Deny applies) or IMPLICIT_DENY (no Allow applies)."""
    applying = [st for st in statements if _applies(st, request)]
    if any(st.effect == "Deny" for st in applying):
        return DENY
    return ALLOW if any(st.effect == "Allow" for st in applying) else IMPLICIT_DENY


def allowed(statements: Iterable[Statement], request: Request) -> bool:
    return decide(statements, request) == ALLOW


# --- the request context of the node's calls ----------------------------------------------------------------------

#: The table's partition key (fleet.aws.bootstrap): `dynamodb:LeadingKeys` is its value.
PARTITION_KEY = "run_id"
_NAME = re.compile(r"#?[A-Za-z_][A-Za-z0-9_]*")
_NOT_ATTRIBUTES = {
    "set", "remove", "add", "delete", "and", "or", "not", "in", "between",
    "attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains", "size",
    "if_not_exists", "list_append",
}  # fmt: skip


def _expression_names(expr: str, names: Mapping[str, str]) -> set[str]:
    """The top-level attribute names an expression touches: placeholders resolved, values (`:v`) and functions left
    out, a path (`a.b`, `a[0]`) counted by its first name."""
    out = set()
    for m in _NAME.finditer(re.sub(r":[A-Za-z0-9_]+", " ", expr)):
        word, before = m.group(), expr[m.start() - 1] if m.start() else " "
        if before in ".]" or word.lower() in _NOT_ATTRIBUTES:
            continue
        out.add(names[word] if word.startswith("#") else word)
    return out


def dynamodb_context(params: Mapping[str, Any]) -> dict[str, ContextValue]:
    """dynamodb:Attributes (every top-level attribute the request names: the key, the item, the update, condition
    and projection expressions), dynamodb:LeadingKeys (the partition key's value), and dynamodb:ReturnValues and
    dynamodb:Select when the request sets them."""
    names = params.get("ExpressionAttributeNames") or {}
    attributes = set(params.get("Key") or {}) | set(params.get("Item") or {})
    for p in ("UpdateExpression", "ConditionExpression", "ProjectionExpression", "KeyConditionExpression"):
        attributes |= _expression_names(params.get(p) or "", names)
    context: dict[str, ContextValue] = {"dynamodb:Attributes": tuple(sorted(attributes))}
    key = params.get("Key") or params.get("Item") or {}
    if PARTITION_KEY in key:
        context["dynamodb:LeadingKeys"] = (next(iter(key[PARTITION_KEY].values())),)
    for p in ("ReturnValues", "Select"):
        if p in params:
            context[f"dynamodb:{p}"] = str(params[p])
    return context


def s3_context(params: Mapping[str, Any]) -> dict[str, ContextValue]:
    """s3:if-none-match when the request sends If-None-Match (PutObject's IfNoneMatch)."""
    return {"s3:if-none-match": str(params["IfNoneMatch"])} if "IfNoneMatch" in params else {}


def request_context(service: str, params: Mapping[str, Any]) -> dict[str, ContextValue]:
    return dynamodb_context(params) if service == "dynamodb" else s3_context(params) if service == "s3" else {}


def denied(statements: Sequence[Statement], requests: Iterable[Request]) -> list[Request]:
    """The requests the statements do not allow."""
    return [r for r in requests if not allowed(statements, r)]
