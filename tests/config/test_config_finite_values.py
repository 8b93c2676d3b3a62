"""Float keys whose meaning needs a finite (or positive) number refuse inf, nan and 0 at
validation, with one line naming the key, instead of failing inside a worker mid-run."""

from __future__ import annotations

import concurrent.futures

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
        # torch's AdamW refuses eps < 0 and nan only when the workers build it, after Ray started;
        # eps 0 divides 0 / (sqrt(0) + 0) = nan on every weight whose gradient is exactly 0
        # (an embedding row of a token not in the batch)
        ("trainer.policy_optimizer.eps=0", "trainer.policy_optimizer.eps", "must be > 0, got 0.0"),
        (
            "trainer.critic_optimizer.eps=-1e-8",
            "trainer.critic_optimizer.eps",
            "must be > 0, got -1e-08",
        ),
        (
            "trainer.policy_optimizer.eps=nan",
            "trainer.policy_optimizer.eps",
            "must be > 0, got nan",
        ),
        # an inf lr or weight decay turns every weight into nan or inf at the first step
        (
            "trainer.policy_optimizer.lr=inf",
            "trainer.policy_optimizer.lr",
            "must be finite, got inf",
        ),
        (
            "trainer.policy_optimizer.weight_decay=inf",
            "trainer.policy_optimizer.weight_decay",
            "must be finite, got inf",
        ),
        # Future.result(timeout=inf) raises OverflowError at the first weight sync
        (
            "trainer.weight_sync_timeout_s=inf",
            "trainer.weight_sync_timeout_s",
            "must be finite, got inf",
        ),
        (
            "trainer.num_cpus_per_worker=inf",
            "trainer.num_cpus_per_worker",
            "must be finite, got inf",
        ),
        (
            "trainer.num_gpus_per_worker=inf",
            "trainer.num_gpus_per_worker",
            "must be finite, got inf",
        ),
        # inf weights in the loss or the reward make every step's loss non-finite
        ("algorithm.entropy_coef=inf", "algorithm.entropy_coef", "must be finite, got inf"),
        ("algorithm.kl_loss_coef=inf", "algorithm.kl_loss_coef", "must be finite, got inf"),
        ("algorithm.init_kl_coef=inf", "algorithm.init_kl_coef", "must be finite, got inf"),
        (
            "algorithm.overlong_penalty_factor=inf",
            "algorithm.overlong_penalty_factor",
            "must be finite, got inf",
        ),
        ("algorithm.kl_target=inf", "algorithm.kl_target", "must be finite, got inf"),
    ],
)
def test_non_finite_or_zero_float_is_refused_naming_the_key(override, key, message):
    with pytest.raises(ConfigError) as info:
        _validate("experiment=smoke", override)
    assert str(info.value) == f"{key}: {message}"


def test_infinite_wait_overflows_a_future():
    # why weight_sync_timeout_s=inf is refused: the trainer waits with Future.result(timeout)
    with pytest.raises(OverflowError):
        concurrent.futures.Future().result(timeout=float("inf"))


def test_finite_values_still_pass():
    typed = _validate(
        "experiment=smoke",
        "trainer.policy_optimizer.eps=1e-6",
        "trainer.policy_optimizer.lr=1e-3",
        "trainer.weight_sync_timeout_s=3600",
        "algorithm.entropy_coef=0.01",
    )
    assert typed.trainer.policy_optimizer.eps == 1e-6
    assert typed.trainer.weight_sync_timeout_s == 3600


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        # lr_lambda returns 1.0 under constant: the floor would never be reached
        (
            ["trainer.policy_optimizer.min_lr_ratio=0.1"],
            "trainer.policy_optimizer.min_lr_ratio",
            "is the cosine schedule's floor, and lr_scheduler is constant (the lr stays at lr "
            "after warm-up): set lr_scheduler=cosine, or min_lr_ratio=0",
        ),
        # the penalty ramps over overlong_buffer_len tokens: 0 applies none, whatever the factor
        (
            ["algorithm.overlong_penalty_factor=2.0"],
            "algorithm.overlong_penalty_factor",
            "is 2.0, but overlong_buffer_len is 0, which turns the overlong penalty off: set "
            "overlong_buffer_len > 0, or leave overlong_penalty_factor at 1.0",
        ),
    ],
)
def test_setting_read_only_with_another_is_refused_without_it(overrides, key, message):
    with pytest.raises(ConfigError) as info:
        _validate("experiment=smoke", *overrides)
    assert str(info.value) == f"{key}: {message}"


def test_settings_pass_with_the_setting_they_need():
    typed = _validate(
        "experiment=smoke",
        "trainer.policy_optimizer.lr_scheduler=cosine",
        "trainer.policy_optimizer.min_lr_ratio=0.1",
        "algorithm.overlong_buffer_len=8",
        "algorithm.overlong_penalty_factor=2.0",
    )
    assert typed.trainer.policy_optimizer.min_lr_ratio == 0.1
    assert typed.algorithm.overlong_penalty_factor == 2.0
