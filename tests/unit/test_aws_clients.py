"""`AwsClients`: every session of a process reads the service models once."""

from __future__ import annotations

import json

from fleet.aws import clients as aws_clients
from fleet.aws.clients import LOCAL_CREDENTIALS, AwsClients, StaticCredentials
from fleet.config.aws import AwsConfig


def test_the_service_models_are_decoded_once_per_process_and_the_loader_does_not_grow(monkeypatch):
    aws = AwsConfig(region="eu-west-1", endpoint_url="http://127.0.0.1:9")
    AwsClients(aws, credentials=LOCAL_CREDENTIALS).client("dynamodb")  # the models, once for the process
    loader = getattr(aws_clients, "_loader", None)
    paths = list(loader.search_paths) if loader else []

    decoded: list[int] = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: decoded.append(len(s)) or real_loads(s, *a, **k))
    for n in range(5):
        other = AwsClients(aws, credentials=StaticCredentials(f"key-{n}", "secret"))
        c = other.client("dynamodb")
        assert c.meta.region_name == "eu-west-1"
        assert other._session.get_credentials().access_key == f"key-{n}"  # each session keeps its own credentials
    assert decoded == []
    assert loader is not None and loader.search_paths == paths
