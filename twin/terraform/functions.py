"""The Terraform functions, operators and string escapes infra/terraform (and infra/packer) use, as Terraform
defines them.

File functions (`file`, `filebase64`) are the evaluator's own: they read through the contents the caller
supplies before the disk.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any


def as_text(value: Any) -> str:
    """A value as Terraform interpolates it into a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (str, int, float)):
        return str(value)
    raise TypeError(f"cannot put {type(value).__name__} into a string")


def _cidrsubnet(prefix: str, newbits: int, netnum: int) -> str:
    net = ipaddress.ip_network(prefix)
    return str(list(net.subnets(prefixlen_diff=newbits))[netnum])


def _one(values: list[Any]) -> Any:
    if len(values) > 1:
        raise ValueError("one() of more than one value")
    return values[0] if values else None


def _coalesce(*values: Any) -> Any:
    for v in values:
        if v is not None and v != "":
            return v
    raise ValueError("coalesce: no non-null argument")


def _merge(*maps: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        out.update(m)
    return out


def _format(spec: str, *args: Any) -> str:
    """Terraform's format() with the verbs %s, %d and %%; any other is refused."""
    values = list(args)

    def one(m: re.Match[str]) -> str:
        if m.group(1) == "%":
            return "%"
        if m.group(1) not in "sd" or not values:
            raise ValueError(f"format {spec!r}: %{m.group(1)} is not evaluated by the twin, or lacks an argument")
        return as_text(values.pop(0))

    return re.sub(r"%(.)", one, spec)


def _basename(path: str) -> str:
    """The last element of a path, trailing slashes dropped (Go's filepath.Base, which Terraform calls)."""
    return path.rstrip("/").rsplit("/", 1)[-1] or ("/" if path else ".")


def _distinct(values: list[Any]) -> list[Any]:
    """The list without its repeated elements, each kept where it first appears."""
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


#: The functions the files call, as Terraform defines them (file reads go through `Evaluator.read_file`).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "basename": _basename,
    "cidrsubnet": _cidrsubnet,
    "coalesce": _coalesce,
    "concat": lambda *lists: [v for lst in lists for v in lst],
    "contains": lambda values, value: value in values,
    "distinct": _distinct,
    "floor": math.floor,
    "format": _format,
    "jsonencode": lambda v: json.dumps(v, separators=(",", ":"), sort_keys=True),
    "length": len,
    "lookup": lambda m, k, *default: m[k] if k in m or not default else default[0],
    "merge": _merge,
    "one": _one,
    "startswith": lambda s, prefix: s.startswith(prefix),
    "tostring": as_text,
    "tonumber": lambda v: v if isinstance(v, (int, float)) else json.loads(v),
    "trimsuffix": lambda s, suffix: s[: -len(suffix)] if suffix and s.endswith(suffix) else s,
    "base64encode": lambda s: base64.b64encode(s.encode()).decode(),
}


#: Terraform's binary operators (`&&` and `||` short-circuit in the evaluator).
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "%": lambda a, b: a % b,
    "&&": lambda a, b: a and b,
    "||": lambda a, b: a or b,
}

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def unescape(text: str) -> str:
    """A quoted string's escapes (\\n, \\t, \\r, \\", \\\\); any other is refused, not guessed."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in _ESCAPES:
            raise ValueError(f"the escape \\{m.group(1)} is not evaluated by the twin")
        return _ESCAPES[m.group(1)]

    return re.sub(r"\\(.)", one, text)
