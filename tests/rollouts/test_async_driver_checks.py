"""The asynchronous source refuses what the synchronous one refuses, with the same line: a
custom rollout driver that breaks ``RolloutDriver.run``'s contract, and (at validation) only
the engine layout that cannot generate while the workers train."""

from __future__ import annotations

import pytest
from async_helpers import EchoEngine, async_cfg, next_batch_within, tokenizer_of

import skyrl
from skyrl.config.errors import ConfigError
from skyrl.config.validate import validate
from skyrl.rollouts.async_rollouts import AsyncRollouts
from skyrl.rollouts.sync import SyncRollouts


@pytest.mark.parametrize(
    ("factory", "sync_problem", "async_problem"),
    [
        # the synchronous step runs the batch's 2 prompts at once, the stream one group
        # (prompt) at a time; n_samples_per_prompt = 2 (experiment=smoke)
        (
            "one_short",
            "returned 3 trajectories, not 2 prompts x 2 samples = 4",
            "returned 1 trajectories, not 1 prompts x 2 samples = 2",
        ),
        (
            "dicts",
            "returned a dict as trajectory 0, not a Trajectory",
            "returned a dict as trajectory 0, not a Trajectory",
        ),
    ],
)
def test_a_driver_breaking_its_contract_is_named_on_both_paths(
    tmp_path, factory, sync_problem, async_problem
):
    """The synchronous source refused such a driver naming ``generator.agent``; the stream
    (``trainer.max_staleness > 0``) trained on a group one sample short (a GRPO group of 1)
    or died on an ``AttributeError`` deep in the row conversion."""
    agent = f"generator.agent=misbehaving_drivers.{factory}"
    contract = (
        ": RolloutDriver.run returns n_samples Trajectory objects per row, in (row, sample) order"
    )
    sync_cfg = async_cfg(agent)
    tok = tokenizer_of(sync_cfg)
    with pytest.raises(ConfigError) as sync_info:
        SyncRollouts(sync_cfg, EchoEngine(tok), tok, tmp_path).next_batch(1)
    assert str(sync_info.value) == f"generator.agent: the rollout driver {sync_problem}{contract}"

    source = AsyncRollouts(
        async_cfg("trainer.max_staleness=1", agent), EchoEngine(tok), tok, tmp_path
    )
    try:
        with pytest.raises(ConfigError) as async_info:
            next_batch_within(source, 1)
    finally:
        source.close()
    assert str(async_info.value) == f"generator.agent: the rollout driver {async_problem}{contract}"


def test_async_accepts_engines_in_actors_and_refuses_an_in_process_one():
    """Several engines run as Ray actors (1 CPU each when ``num_cpus_per_engine`` is 0,
    ``docs/config-reference.md``): they generate while the workers train, yet
    ``num_engines=2 num_cpus_per_engine=0`` was refused as if in-process. One engine with
    no CPUs or GPUs of its own is in-process: still refused."""
    cfg = validate(
        skyrl.compose(
            [
                "trainer.max_staleness=1",
                "generator.num_engines=2",
                "generator.num_cpus_per_engine=0",
            ]
        )
    )
    assert cfg.generator.engines_in_actors
    with pytest.raises(ConfigError) as info:
        validate(skyrl.compose(["trainer.max_staleness=1", "generator.num_cpus_per_engine=0"]))
    assert info.value.key == "trainer.max_staleness"
    assert "set generator.num_cpus_per_engine=1 (CPU)" in info.value.message
