"""The planner is pure decision logic: it imports without boto3 or botocore, as the layer rules require."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_plan_imports_without_boto3_or_botocore():
    code = "import sys; sys.modules['boto3'] = sys.modules['botocore'] = None; import hub.plan"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
