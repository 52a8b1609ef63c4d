"""The config the embedded default gives its nodes."""

from fleet.config import Config
from fleet.local.stack import Component, StackState
from hub.local_env import effective_config

STATE = StackState("sid", "/tmp/x", None, {
    "moto": Component("moto", 1, None, "http://127.0.0.1:5000"),
    "grid": Component("grid", 2, None, "http://127.0.0.1:4444", {"publish": 4442, "subscribe": 4443}),
    "demo": Component("demo", 3, None, "http://127.0.0.1:8800"),
}, 0.0)


def config(**kw):
    return Config.model_validate({"sites": [{"id": "a", "start_url": "{demo}/s/a/?pages=2"},
                                            {"id": "b", "start_url": "https://b.test/"}], **kw})


def test_demo_urls_and_the_moto_endpoint_are_filled_in():
    eff = effective_config(config(), STATE, cpus=2)
    assert eff.site("a").start_url == "http://127.0.0.1:8800/s/a/?pages=2"
    assert eff.site("b").start_url == "https://b.test/"
    assert eff.aws.endpoint_url == "http://127.0.0.1:5000"


def test_local_nodes_are_capped_by_the_machine_unless_configured():
    assert effective_config(config(fleet={"max_nodes": 20}), STATE, cpus=2).fleet.max_nodes == 4
    assert effective_config(config(fleet={"max_nodes": 3}), STATE, cpus=2).fleet.max_nodes == 3
    capped = config(fleet={"max_nodes": 20}, local={"max_nodes": 12})
    assert effective_config(capped, STATE, cpus=2).fleet.max_nodes == 12
