"""`gridfleet config from-terraform`: the `aws:` section of fleet.yaml from `terraform output -json`.

infra/terraform has one output, `gridfleet_aws`, whose value holds exactly the
`aws:` keys; this reads it, validates it with the config schema and prints it as
YAML to paste into (or merge with) fleet.yaml.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import ValidationError

from fleet.config import AwsConfig
from fleet.errors import UsageError

OUTPUT = "gridfleet_aws"


def aws_section(tf_output_json: str, source: str = "terraform output") -> dict[str, Any]:
    try:
        outputs = json.loads(tf_output_json)
    except ValueError as e:
        raise UsageError(f"{source}: not the JSON of `terraform output -json`: {e}") from None
    if not isinstance(outputs, dict) or OUTPUT not in outputs:
        raise UsageError(f"{source}: no output {OUTPUT!r} (is this the output of infra/terraform?)")
    value = outputs[OUTPUT].get("value") if isinstance(outputs[OUTPUT], dict) else None
    if not isinstance(value, dict):
        raise UsageError(f"{source}: output {OUTPUT!r} has no object value")
    try:
        AwsConfig.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0]
        raise UsageError(f"{source}: {OUTPUT}.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return {"aws": value}


def render(section: dict[str, Any]) -> str:
    return "# from `terraform output -json` of infra/terraform\n" + yaml.safe_dump(section, sort_keys=False)
