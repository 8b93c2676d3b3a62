"""A reward the training rows cannot hold: finite in Python (float64) but past float32's
largest value, it became inf in the rows' ``rewards`` (float32) and made every advantage of
its group NaN. The agent loop now counts it as an env error, like a NaN or inf reward."""

import logging

import pytest
from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.inference.base import SamplingParams


class Huge(TextEnv):
    """Reward 1, or the row's ``extras["reward"]``."""

    def step(self, action_text):
        return StepResult([], self.extras.get("reward", 1.0), True)


@pytest.mark.parametrize(
    ("reward", "shown"),
    [(1e39, "reward is 1e+39, beyond float32's +-3.403e+38"), (-3.5e38, "reward is -3.5e+38")],
)
def test_a_reward_beyond_float32_is_an_env_error_of_its_trajectory(tok, caplog, reward, shown):
    rows = [PromptRow("a", "s", {}, uid="ok"), PromptRow("b", "s", {"reward": reward}, uid="big")]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), Huge, False).generate(rows, 2, SamplingParams())
    assert out.rewards == [1.0, 1.0, 0.0, 0.0]
    assert out.stop_reasons == ["stop", "stop", "env_error", "env_error"]
    assert out.metrics["env/errors"] == 2  # one per trajectory of the big row
    logged = [r.getMessage() for r in caplog.records if shown in r.getMessage()]
    assert len(logged) == 1 and logged[0].startswith(f"Huge.step: {shown}"), caplog.text


def test_the_largest_float32_reward_still_trains(tok):
    # 3.4e38 < 3.4028e38: held by float32 as it is (to float32's precision)
    rows = [PromptRow("b", "s", {"reward": 3.4e38}, uid="big")]
    out = make(tok, FakeEngine(tok), Huge, False).generate(rows, 1, SamplingParams())
    assert out.rewards == [3.4e38] and out.stop_reasons == ["stop"]
