"""Names for a stack applied on a moto server that other stacks share."""

from __future__ import annotations

import uuid


def stack_names(prefix: str) -> dict[str, str]:
    """The Terraform variables without defaults, and the names two stacks on one server may not share."""
    hx = uuid.uuid4().hex[:8]
    return {
        "name_prefix": f"{prefix}{hx}",
        "bucket_name": f"{prefix}-{hx}-results",
        "table_name": f"{prefix}-{hx}-status",
        "queue_name": f"{prefix}-{hx}-sites",
    }
