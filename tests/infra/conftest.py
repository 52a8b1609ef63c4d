"""One stack of infra/terraform, applied by the EC2 twin's evaluator to a moto server of these tests' own.

What the stack sends to AWS (its policy documents with every reference resolved, its log groups) is read from
this apply rather than from the .tf text, so the checks see ARNs and names as AWS would. The variables are the
defaults but for the names two stacks may not share.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from embedded.moto_server import make_dynamodb_writes_atomic
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients
from fleet.config.aws import AwsConfig
from tests.helpers.stacks import stack_names
from twin.terraform.apply import StackOutputs, apply_stack

TF_DIR = Path(__file__).resolve().parents[2] / "infra" / "terraform"
REGION = "ap-northeast-2"
HUB_USER_DATA = "#cloud-config\n"


@dataclass(frozen=True)
class Applied:
    """An applied stack and clients on the server that holds it."""

    clients: AwsClients
    outputs: StackOutputs


@pytest.fixture(scope="session")
def applied() -> Iterator[Applied]:
    make_dynamodb_writes_atomic()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
        clients = AwsClients(AwsConfig(endpoint_url=endpoint, region=REGION), credentials=LOCAL_CREDENTIALS)
        ami = clients.client("ec2").describe_images()["Images"][0]["ImageId"]
        yield Applied(
            clients, apply_stack(clients, TF_DIR, stack_names("gfi"), hub_user_data=HUB_USER_DATA, ami_id=ami)
        )
    finally:
        server.stop()
