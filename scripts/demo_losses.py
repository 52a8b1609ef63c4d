"""Exit 1 if a run's summary shows a false loss (an attempt ended `lost` or `spot`, a node terminated as lost).

`make demo` injects no fault, so every such loss is a defect; the run's own check counted them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: str) -> int:
    try:
        summary = json.loads(Path(path).read_text())
        check = summary["check"]
        losses = int(check["false_losses"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"demo: cannot read the run's check from {path}: {e}", file=sys.stderr)
        return 1
    outcomes: dict[str, int] = {}
    for site in summary.get("sites", {}).values():
        for attempt in site.get("attempts", []):
            outcomes[attempt.get("outcome")] = outcomes.get(attempt.get("outcome"), 0) + 1
    print("demo: attempts by outcome: " + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items(), key=str)))
    if losses:
        print(f"demo: {losses} false loss(es) in a run with no injected fault:", file=sys.stderr)
        for text in check.get("false_loss_details", []):
            print(f"  {text}", file=sys.stderr)
        return 1
    print("demo: no false losses (no attempt lost or spot, no node terminated as lost)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: demo_losses.py runs/<run_id>/summary.json", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1]))
