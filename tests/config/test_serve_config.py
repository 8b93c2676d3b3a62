"""``ServeConfig``'s own value rules (``skyrl-serve``'s ``serve`` node): refused where the
config is validated, naming the full key, before anything binds or loads."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from skyrl.config import ConfigError, register_configs
from skyrl.config.root import ServeConfig
from skyrl.config.validate import validate


def _validate(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        # 70000 used to wrap to 70000 - 65536 = 4464 in the bind
        (["serve.port=70000"], "serve.port", "must be 0..65535 (0: any free port), got 70000"),
        (["serve.port=-1"], "serve.port", "must be 0..65535 (0: any free port), got -1"),
        (["serve.host="], "serve.host", "empty (0.0.0.0 listens on every interface)"),
        # before: "" (and "  ") silently served the model as model.path
        (
            ["serve.model_name="],
            "serve.model_name",
            "is empty; leave it unset (null) to serve the model as model.path",
        ),
        (
            ["serve.model_name='  '"],
            "serve.model_name",
            "is empty; leave it unset (null) to serve the model as model.path",
        ),
    ],
)
def test_bad_serve_values_name_the_key(overrides, key, message):
    with pytest.raises(ConfigError) as info:
        _validate(*overrides)
    assert (info.value.key, info.value.message) == (key, message)


@pytest.mark.parametrize("port", [0, 1, 65535])
def test_the_port_range_ends_are_valid(port):
    assert ServeConfig(port=port).port == port


def test_an_unset_model_name_is_valid():
    assert _validate("serve.model_name=null").serve.model_name is None
    assert _validate("serve.model_name=smol").serve.model_name == "smol"
