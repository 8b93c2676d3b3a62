"""An external agent's reward beyond float32's range (``REWARD_MAX``) is an env error, as the
built-in agent loop's ``checked_step`` makes it: the float32 training rows would hold inf."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from skyrl.data.prompts import PromptRow
from skyrl.generators.agent_loop import REWARD_MAX
from skyrl.inference.base import SamplingParams

ROW = PromptRow("What is 1 + 1?", "toy", {}, uid="p0")


def _returns(value):
    async def agent(client, row):
        return value

    return agent


def _trajectory(tokenizer, value, by_reward_fn):
    from skyrl.generators.trajectory import DriverContext, LoopSettings, VersionClock
    from skyrl.serve.harness import HarnessDriver

    ctx = DriverContext(object(), tokenizer, lambda: None, LoopSettings(64, 32, 4), VersionClock())
    if by_reward_fn:
        driver = HarnessDriver(ctx, _returns(None), 5.0, lambda row, messages: value)
    else:
        driver = HarnessDriver(ctx, _returns(value), 5.0)
    try:
        (traj,) = asyncio.run(driver.run([ROW], 1, SamplingParams(seed=3)))
    finally:
        driver.close()
    return traj


@pytest.mark.parametrize("by_reward_fn", [False, True])
@pytest.mark.parametrize("value", [1e39, -1e39, 10**40])
def test_a_reward_beyond_float32_is_an_env_error(tiny_tokenizer, caplog, value, by_reward_fn):
    # |1e39| > 3.4028e38 = float32's max: in the float32 rows it would be inf
    assert abs(float(value)) > float(np.finfo(np.float32).max)
    with caplog.at_level(logging.WARNING, logger="skyrl.serve.harness"):
        traj = _trajectory(tiny_tokenizer, value, by_reward_fn)
    assert (traj.reward, traj.stop_reason, traj.env_errors) == (0.0, "env_error", 1)
    source = "generator.agent_reward_fn" if by_reward_fn else "the agent"
    assert f"{source} returned {float(value):g}, beyond float32's +-3.403e+38" in caplog.text


@pytest.mark.parametrize("value", [REWARD_MAX, -REWARD_MAX, 1e38])
def test_a_reward_at_float32s_limit_is_kept(tiny_tokenizer, value):
    traj = _trajectory(tiny_tokenizer, value, by_reward_fn=False)
    assert (traj.reward, traj.stop_reason, traj.env_errors) == (value, "stop", 0)
    assert np.isfinite(np.float32(traj.reward))


def test_an_int_past_any_float_is_named(tiny_tokenizer, caplog):
    # float(10**400) raises OverflowError: its own text ("int too large to convert to float")
    # named neither the agent nor the reward
    with caplog.at_level(logging.WARNING, logger="skyrl.serve.harness"):
        traj = _trajectory(tiny_tokenizer, 10**400, by_reward_fn=False)
    assert (traj.reward, traj.stop_reason, traj.env_errors) == (0.0, "env_error", 1)
    assert "the agent returned a number past any float, beyond float32's +-3.403e+38" in (
        caplog.text
    )
