"""`gridfleet config from-terraform`: the `aws:` section of fleet.yaml from `terraform output -json`.

infra/terraform has one output, `gridfleet_aws`, whose value holds exactly the
`aws:` keys; this reads it, validates it with the config schema and prints it as
YAML to paste into (or merge with) fleet.yaml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fleet.config.aws import AwsConfig
from fleet.errors import UsageError

OUTPUT = "gridfleet_aws"
#: `terraform output -json` of infra/terraform is a few KB; anything this large is not it.
MAX_BYTES = 5 * 1024 * 1024


def read_source(path: str) -> tuple[str, str]:
    """(text, name) of `--tf-output`: a file, or stdin for "-". UsageError naming the source if it cannot be
    read, is larger than MAX_BYTES or is not UTF-8."""
    source = "stdin" if path == "-" else path
    try:
        if path == "-":
            if sys.stdin is None:
                raise UsageError("stdin: not open: give the file with --tf-output")
            stream = getattr(sys.stdin, "buffer", None)
            raw: bytes | str = stream.read(MAX_BYTES + 1) if stream is not None else sys.stdin.read(MAX_BYTES + 1)
        else:
            with Path(path).open("rb") as f:
                raw = f.read(MAX_BYTES + 1)
    except UnicodeDecodeError as e:  # a text stdin that decodes as it reads
        raise UsageError(f"{source}: not UTF-8 text: {e.reason}") from None
    except OSError as e:
        raise UsageError(f"{source}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{source}: larger than {MAX_BYTES // 2**20} MB: not the output of `terraform output -json`")
    if isinstance(raw, str):
        return raw, source
    try:
        return raw.decode("utf-8"), source
    except UnicodeDecodeError as e:
        raise UsageError(f"{source}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def aws_section(tf_output_json: str, source: str = "terraform output") -> dict[str, Any]:
    try:
        outputs = json.loads(tf_output_json)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser's stack
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
