"""An operator's deployment of a gridfleet stack, done on the EC2 twin the way it is done on AWS.

`deploy()` follows the AWS path of docs/aws/first-night.md, each step through the same code an operator runs:

0. with `node_image`, a node image baked as infra/packer bakes it, from the bundle of `gridfleet bundle`
   (`TwinStack.bake_node_image`), its AMI id in the SSM parameter the stack's `node_ami_parameter` names;
1. the stack's resources as infra/terraform defines them (`twin.terraform.apply`, in place of `terraform apply`),
   with the hub's user-data rendered by `gridfleet render hub` from the operator's fleet.yaml;
2. the `aws:` section of fleet.yaml from the stack's `gridfleet_aws` output (`gridfleet config from-terraform`);
3. `gridfleet aws bootstrap` and `gridfleet bundle --upload --efs-utils-deb` (the code bundle, the Lambda package,
   the hub's config and the nodes' amazon-efs-utils package, here the twin's stand-in, in the bucket); with
   `node_image`, `--built`: the bundle the image was baked from, not built again.

The commands run as processes of their own with the operator's environment (`Deployed.env`): credentials that
the twin's AWS takes and nothing of this process's AWS settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from twin.account import DEBIAN_PARAMETER
from twin.terraform.apply import StackOutputs, apply_stack

REPO = Path(__file__).resolve().parents[1]
TERRAFORM_DIR = REPO / "infra" / "terraform"


@dataclass(frozen=True)
class Deployed:
    work: Path
    config_path: Path  # the operator's fleet.yaml, aws: from the stack's outputs
    outputs: StackOutputs  # what the apply made
    env: dict[str, str]  # the operator's environment for gridfleet commands

    @property
    def config(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.config_path.read_text()))

    def gridfleet(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        return gridfleet(self.env, self.work, *args, timeout_s=timeout_s)


def operator_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GRIDFLEET_"))}
    env |= {
        "AWS_ACCESS_KEY_ID": "twin",
        "AWS_SECRET_ACCESS_KEY": "twin",
        "AWS_EC2_METADATA_DISABLED": "true",
        "GRIDFLEET_HOME": str(work / "home"),
    }
    return env


def gridfleet(env: dict[str, str], cwd: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`gridfleet ARGS` as the operator runs it; a failure raises with its output."""
    cmd = [sys.executable, "-m", "cli.main", *args]
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"gridfleet {' '.join(args)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def linked_role(iam: Any, service: str) -> None:
    """`aws iam create-service-linked-role --aws-service-name SERVICE`, as an operator runs it once per account."""
    try:
        iam.create_service_linked_role(AWSServiceName=service)
    except iam.exceptions.InvalidInputException:
        pass  # there already
    except iam.exceptions.EntityAlreadyExistsException:
        pass


def node_image_parameter(stack: str) -> str:
    """The SSM parameter holding the AMI id of the node image baked for `stack`."""
    return f"/{stack}/node-ami"


def deploy(
    twin: Any, work: Path, fleet: dict[str, Any], variables: dict[str, Any], *, node_image: bool = False
) -> Deployed:
    """The stack `variables` names (Terraform's, `name_prefix` first) on `twin`, running `fleet`'s sites; with
    `node_image`, its nodes launched from a node image baked for it (the hub stays on the stock image).

    `fleet` is fleet.yaml without its `aws:` keys that come from the stack (any it has win); `aws.endpoint_url`
    is set to the twin's AWS."""
    work.mkdir(parents=True, exist_ok=True)
    env = operator_env(work)
    stack = str(variables["name_prefix"])
    aws = {"region": twin.region, "stack": stack, "bucket": variables["bucket_name"], "endpoint_url": twin.endpoint}
    config_path = work / "fleet.yaml"
    config_path.write_text(yaml.safe_dump({**fleet, "aws": {**aws, **fleet.get("aws", {})}}, sort_keys=False))
    hub_user_data = gridfleet(env, work, "render", "hub", "--config", str(config_path)).stdout
    stock = variables.get("ami_parameter", DEBIAN_PARAMETER.format(arch="amd64"))  # the stack's image, as AWS says
    ami = twin.client("ssm").get_parameter(Name=stock)["Parameter"]["Value"]
    linked_role(twin.client("iam"), "spot.amazonaws.com")  # once per account, before its first spot launch
    if node_image:  # as an operator bakes one: `gridfleet bundle`, then infra/packer on that bundle
        gridfleet(env, work, "bundle", "--out", str(work / "image"), "--config", str(config_path))
        parameter = node_image_parameter(stack)
        twin.bake_node_image(work / "image" / "gridfleet-bundle.tar.gz", parameter)
        variables = {**variables, "node_ami_parameter": parameter}
    outputs = apply_stack(
        twin, TERRAFORM_DIR, {**variables, "region": twin.region}, hub_user_data=hub_user_data, ami_id=ami
    )
    tf_output = work / "terraform-output.json"  # as `terraform output -json` writes it
    tf_output.write_text(json.dumps({"gridfleet_aws": {"sensitive": False, "value": dict(outputs.gridfleet_aws)}}))
    section = gridfleet(env, work, "config", "from-terraform", "--tf-output", str(tf_output)).stdout
    from_stack = dict(yaml.safe_load(section))
    from_stack = dict(from_stack.get("aws", from_stack))
    doc = {**fleet, "aws": {**from_stack, **aws, **fleet.get("aws", {})}}
    config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    gridfleet(env, work, "aws", "bootstrap", "--config", str(config_path))
    # the operator's amazon-efs-utils package (Debian has none): here the twin's stand-in for it
    deb = str(twin.efs_utils_deb)
    # the bundle the image was baked from, uploaded as it is; else built here
    out = ["--built", str(work / "image")] if node_image else ["--out", str(work / "dist")]
    gridfleet(env, work, "bundle", "--upload", *out, "--config", str(config_path), "--efs-utils-deb", deb)
    return Deployed(work, config_path, outputs, env)
