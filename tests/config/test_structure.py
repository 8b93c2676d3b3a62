"""The composed config has the schema's keys, and containers where the schema declares them."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from skyrl.config import ConfigError, register_configs
from skyrl.config.validate import validate


def _validate(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


@pytest.mark.parametrize(
    ("override", "key", "message"),
    [
        ("+trainer.lrx=1", "trainer.lrx", "unknown key"),
        ("++trainer.lrx=1", "trainer.lrx", "unknown key"),
        ("+foo=1", "foo", "unknown key"),
        ("++foo={a:1}", "foo", "unknown key"),
        (
            "+trainer.policy_optimizer.lrx=1",
            "trainer.policy_optimizer.lrx",
            "unknown key (did you mean 'lr'?)",
        ),
        (
            "+generator.sampling.temprature=0.5",
            "generator.sampling.temprature",
            "unknown key (did you mean 'temperature'?)",
        ),
        # before: "unknown key (did you mean 'share_prompts'?)"
        (
            "++trainer.max_prompt_length=64",
            "trainer.max_prompt_length",
            "unknown key (did you mean 'generator.max_prompt_length'?)",
        ),
        (
            "~model",
            "model",
            "required by the schema; it cannot be deleted with ~ (set a value instead)",
        ),
        (
            "trainer.policy_optimizer=${trainer.seed}",
            "trainer.policy_optimizer",
            "${trainer.seed} resolves to int 42, not OptimizerConfig",
        ),
        (
            "trainer.policy_optimizer=${generator.sampling}",
            "trainer.policy_optimizer",
            "${generator.sampling} resolves to SamplingConfig, not OptimizerConfig",
        ),
        (
            "trainer.loggers=${trainer.seed}",
            "trainer.loggers",
            "${trainer.seed} resolves to int 42, not a list",
        ),
        (
            "environment.kwargs=${data.train_files}",
            "environment.kwargs",
            "${data.train_files} resolves to a list, not a mapping",
        ),
    ],
)
def test_what_the_schema_does_not_declare_is_refused(override, key, message):
    with pytest.raises(ConfigError) as info:
        _validate(override)
    assert (info.value.key, info.value.message) == (key, message)


def test_keys_can_be_added_under_a_free_form_mapping():
    typed = _validate("+environment.kwargs.foo=1", "++environment.kwargs.bar={baz:[1,2]}")
    assert typed.environment.kwargs == {"foo": 1, "bar": {"baz": [1, 2]}}


def test_a_container_interpolation_of_the_right_kind_passes():
    typed = _validate("trainer.critic_optimizer=${trainer.policy_optimizer}")
    assert typed.trainer.critic_optimizer == typed.trainer.policy_optimizer
