"""An env's ``init`` that returns no messages, or messages with only blank content, is refused
(``checked_opening``: at load, and as its trajectory's env error in the loop). No messages at
all stopped the whole run in the chat template ("Cannot apply chat template to an empty
conversation"); blank ones trained the model on answering nothing."""

import logging

import pytest
from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators.agent_loop import BadEnvResult, checked_opening
from skyrl.inference.base import SamplingParams


class Opens(TextEnv):
    """Opens with ``extras["opening"]`` (a custom env building it from a row's field)."""

    def init(self, prompt, extras):
        self.extras = extras
        return extras["opening"], {}

    def step(self, action_text):
        return StepResult([], 1.0, True)


def row(opening, uid="u") -> PromptRow:
    return PromptRow("q", "s", {"opening": opening}, uid=uid)


BLANK = [{"role": "system", "content": " "}, {"role": "user", "content": "\n"}]


@pytest.mark.parametrize(
    ("opening", "problem"),
    [([], "messages is empty"), (BLANK, "every message's content is blank")],
)
def test_an_opening_with_no_text_is_refused(opening, problem):
    with pytest.raises(BadEnvResult) as raised:
        checked_opening(Opens(), row(opening))
    assert str(raised.value) == problem


def test_an_opening_with_some_text_passes():
    opening = [{"role": "system", "content": ""}, {"role": "user", "content": "q"}]
    assert checked_opening(Opens(), row(opening)) == opening


def test_the_loop_ends_such_trajectories_as_env_errors(tok, caplog):
    rows = [
        row([{"role": "user", "content": "q"}], "ok"),
        row([], "empty"),
        row(BLANK, "blank"),
    ]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), Opens, True).generate(rows, 1, SamplingParams())
    assert out.rewards == [1.0, 0.0, 0.0]
    assert out.stop_reasons == ["stop", "env_error", "env_error"]
    assert out.prompt_token_ids[1:] == [[], []]  # no turn was generated
    assert out.metrics["env/errors"] == 2
    for problem in ("messages is empty", "every message's content is blank"):
        line = f"Opens.init: {problem}; its trajectory ends with reward 0 (env_error)"
        assert line in caplog.text
