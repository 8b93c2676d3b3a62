"""An env that calls ``sys.exit()`` (its own code, or a library's argparse error) in a call
ends that trajectory as an env error, as any raise does: its ``SystemExit`` was handed from
the env thread to the event loop, which lets it through every task, and the whole run
stopped (the generator raised ``SystemExit: 2``, with asyncio's 'Task was destroyed but it
is pending!')."""

import logging
import sys

import pytest
from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.inference.base import SamplingParams

ROWS = [PromptRow("ok", "s", {}, uid="ok"), PromptRow("exit", "s", {"exit": True}, uid="exit")]


class ExitsInStep(TextEnv):
    def step(self, action_text):
        if self.extras.get("exit"):
            sys.exit(2)
        return StepResult([], 1.0, True)


class ExitsInInit(TextEnv):
    def init(self, prompt, extras):
        if extras.get("exit"):
            raise SystemExit("usage: grader [-h] answer")
        return super().init(prompt, extras)

    def step(self, action_text):
        return StepResult([], 1.0, True)


class ExitsInClose(TextEnv):
    def step(self, action_text):
        return StepResult([], 1.0, True)

    def close(self):
        sys.exit(0)


def loop_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "skyrl.generators.agent_loop"]


@pytest.mark.parametrize(
    ("env_cls", "logged"),
    [
        (ExitsInStep, "ExitsInStep.step: raised SystemExit: 2"),
        (ExitsInInit, "ExitsInInit.init: raised SystemExit: usage: grader [-h] answer"),
    ],
)
def test_an_env_that_exits_ends_its_own_trajectory_only(tok, caplog, env_cls, logged):
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), env_cls, False).generate(ROWS, 2, SamplingParams())
    assert out.rewards == [1.0, 1.0, 0.0, 0.0]
    assert out.stop_reasons == ["stop", "stop", "env_error", "env_error"]
    assert out.metrics["env/errors"] == 2.0
    assert loop_messages(caplog) == [f"{logged}; its trajectory ends with reward 0 (env_error)"]


def test_a_close_that_exits_is_logged_and_changes_no_reward(tok, caplog):
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), ExitsInClose, False).generate(ROWS, 1, SamplingParams())
    assert out.rewards == [1.0, 1.0]
    assert loop_messages(caplog) == ["ExitsInClose.close: raised SystemExit: 0"]
