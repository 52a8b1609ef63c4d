"""What AWS bills for gridfleet's state: the size of a DynamoDB item, the request units of a read or a write,
and the on-demand prices they are charged at.

DynamoDB sizes an item as the UTF-8 bytes of its attribute names and values
(a number about one byte per two significant digits plus one, a boolean or null
one byte, a list or map 3 bytes plus one byte per element); a standard write
costs one write request unit per KB of the item, rounded up (an update the
larger of the item before and after it), and a strongly consistent read one
read request unit per 4 KB (an eventually consistent one half that).

Prices are AWS's published on-demand prices for us-east-1 (N. Virginia), USD:
DynamoDB $0.625 per million write request units and $0.125 per million read
request units (the on-demand pricing page, since November 2024); S3 Standard
$0.005 per 1,000 PUT/COPY/POST/LIST and $0.0004 per 1,000 GET requests; SQS
$0.40 per million requests of a standard queue (the first million each month
free, not counted here). EC2 and SSM API calls cost nothing.
Other regions differ by a factor, not in shape.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
ITEM_MAX_BYTES = 400 * 1024

USD_PER_WRITE_UNIT = 0.625 / 1e6
USD_PER_READ_UNIT = 0.125 / 1e6
USD_PER_S3_PUT = 0.005 / 1000
USD_PER_S3_GET = 0.0004 / 1000
USD_PER_SQS_REQUEST = 0.40 / 1e6


@functools.lru_cache(maxsize=1 << 16)
def _number_size(v: int | float | Decimal) -> int:
    """About one byte per two significant digits (leading and trailing zeros trimmed), plus one (remembered: a
    simulated run sizes millions of counts and epochs, most of them seen before)."""
    text = str(v).lstrip("-")
    if "e" in text.lower():
        text = format(Decimal(text), "f")
    digits = text.replace(".", "").strip("0") or "0"
    return min(21, math.ceil(len(digits) / 2) + 1)


def _value_size(v: Any) -> int:
    if type(v) is Decimal:  # the most common value of an item as `fleet.record.codec` encodes it
        return _number_size(v)
    if v is None or isinstance(v, bool):
        return 1
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, (bytes, bytearray)):
        return len(v)
    if isinstance(v, (int, float, Decimal)):
        return _number_size(v)
    if isinstance(v, Mapping):
        return 3 + sum(len(str(k).encode()) + _value_size(x) + 1 for k, x in v.items())
    if isinstance(v, (list, tuple, set, frozenset)):
        return 3 + sum(_value_size(x) + 1 for x in v)
    raise TypeError(f"cannot size {type(v).__name__} as a DynamoDB value")


def attribute_size(name: str, value: Any) -> int:
    return len(name.encode()) + _value_size(value)


def item_size(item: Mapping[str, Any]) -> int:
    """The bytes DynamoDB counts for an item (as `fleet.record.codec` encodes it): names and values."""
    return sum(attribute_size(k, v) for k, v in item.items())


def write_units(size: int) -> int:
    """Write request units of one standard write of an item of `size` bytes (at least one)."""
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


def read_units(size: int, consistent: bool = True) -> float:
    """Read request units of reading `size` bytes (one item, or a Query page's items together)."""
    units = max(1, math.ceil(size / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


def usd(
    write_units: float = 0, read_units: float = 0, s3_puts: float = 0, s3_gets: float = 0, sqs_requests: float = 0
) -> float:
    """What those requests cost at the on-demand prices above."""
    return (
        write_units * USD_PER_WRITE_UNIT
        + read_units * USD_PER_READ_UNIT
        + s3_puts * USD_PER_S3_PUT
        + s3_gets * USD_PER_S3_GET
        + sqs_requests * USD_PER_SQS_REQUEST
    )
