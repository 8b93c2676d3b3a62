"""An env's ``done`` must be a bool: a step whose ``done`` is anything else (its reward, with
the two arguments swapped; None) is an env error of its trajectory, not read by truthiness."""

import logging

import numpy as np
import pytest
import torch
from agent_loop_helpers import ROWS, FakeEngine, make

from skyrl.envs.base import StepResult, TextEnv
from skyrl.inference.base import SamplingParams


class Done(TextEnv):
    """Reward 1 on its first step, with ``done`` as the class sets it."""

    done: object = True

    def step(self, action_text):
        return StepResult([{"role": "user", "content": "go on"}], 1.0, self.done)


def env_with(done):
    return type("Done", (Done,), {"done": done})


@pytest.mark.parametrize(
    ("done", "shown"),
    [
        (0.5, "0.5"),  # StepResult(obs, False, 0.5): done and reward swapped ended it, reward 0
        (None, "None"),  # ran on to max_turns with reward 1 on every step
        ("False", "'False'"),  # a non-empty string is truthy: it ended the episode
        (1, "1"),
    ],
)
def test_a_done_that_is_not_a_bool_is_an_env_error(tok, caplog, done, shown):
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), env_with(done), False).generate(ROWS, 1, SamplingParams())
    assert out.stop_reasons == ["env_error", "env_error"]
    assert out.rewards == [0.0, 0.0]
    assert out.metrics["env/errors"] == 2.0
    assert out.metrics["generate/turns_mean"] == 1.0  # the step of turn 0 failed
    lines = [r.getMessage() for r in caplog.records if "Done.step" in r.getMessage()]
    assert lines == [f"Done.step: done is {shown}, not True or False; its trajectory ends with "
                     "reward 0 (env_error)"]  # fmt: skip


@pytest.mark.parametrize("done", [True, np.bool_(True), np.array(True), torch.tensor(True)])
def test_bools_of_numpy_and_torch_end_the_episode(tok, done):
    out = make(tok, FakeEngine(tok), env_with(done), False).generate(ROWS, 1, SamplingParams())
    assert out.stop_reasons == ["stop", "stop"] and out.rewards == [1.0, 1.0]
    assert out.metrics["env/errors"] == 0.0 and out.metrics["generate/turns_mean"] == 1.0


@pytest.mark.parametrize("done", [False, np.bool_(False), torch.tensor(False)])
def test_a_false_done_runs_to_max_turns(tok, done):
    out = make(tok, FakeEngine(tok), env_with(done), False, max_turns=2).generate(
        ROWS, 1, SamplingParams()
    )
    assert out.stop_reasons == ["max_turns", "max_turns"] and out.rewards == [1.0, 1.0]
    assert out.metrics["generate/turns_mean"] == 2.0
