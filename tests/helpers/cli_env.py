"""The environment of a CLI process a test starts."""

from __future__ import annotations

import os
from pathlib import Path


def without_aws_credentials(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment with no way to AWS credentials: no AWS_* variable, no shared credentials or
    config file, no instance metadata; GRIDFLEET_HOME in `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        GRIDFLEET_HOME=str(tmp_path / "home"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        **extra,
    )
    return env
