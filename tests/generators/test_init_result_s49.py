"""An env's ``init`` must return the pair ``(messages, info)``: one that returns the messages
alone is named as such, at load (``checked_opening``) and in the loop (an env error)."""

import logging

import pytest
from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators.agent_loop import BadEnvResult, checked_opening
from skyrl.inference.base import SamplingParams

SYSTEM = {"role": "system", "content": "Be brief."}


class ReturnsMessagesAlone(TextEnv):
    """``init`` returns ``extras["opening"]`` as it stands (the bug: no info beside it)."""

    def init(self, prompt, extras):
        self.extras = extras
        return extras["opening"]

    def step(self, action_text):
        return StepResult([], 1.0, True)


def row(opening) -> PromptRow:
    return PromptRow("q", "s", {"opening": opening}, uid="u")


@pytest.mark.parametrize(
    ("opening", "problem"),
    [
        # two messages unpacked as (message, info): "messages is a dict, not a list of messages"
        ([SYSTEM, {"role": "user", "content": "q"}], "a list of 2 messages"),
        # one message: "not enough values to unpack (expected 2, got 1)"
        ([{"role": "user", "content": "q"}], "a list of 1 message"),
        ([SYSTEM, SYSTEM, {"role": "user", "content": "q"}], "a list of 3 messages"),
        ("q", "a str"),
        (([SYSTEM], {}, {}), "a tuple of 3 items"),
    ],
)
def test_an_init_that_does_not_return_messages_and_info_is_named(opening, problem):
    with pytest.raises(BadEnvResult) as raised:
        checked_opening(ReturnsMessagesAlone(), row(opening))
    assert str(raised.value) == f"it returned {problem}, not the pair (messages, info)"


def test_the_pair_still_passes_and_a_lone_message_in_it_is_still_named():
    messages = [SYSTEM, {"role": "user", "content": "q"}]
    assert checked_opening(ReturnsMessagesAlone(), row((messages, {}))) == messages
    assert checked_opening(ReturnsMessagesAlone(), row([messages, {}])) == messages
    with pytest.raises(BadEnvResult, match="messages is a dict, not a list of messages"):
        checked_opening(ReturnsMessagesAlone(), row((SYSTEM, {})))


def test_the_loop_ends_such_a_trajectory_as_an_env_error_naming_it(tok, caplog):
    rows = [
        PromptRow("a", "s", {"opening": ([SYSTEM], {})}, uid="ok"),
        PromptRow("b", "s", {"opening": [SYSTEM, {"role": "user", "content": "b"}]}, uid="bad"),
    ]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), ReturnsMessagesAlone, False).generate(
            rows, 1, SamplingParams()
        )
    assert out.rewards == [1.0, 0.0] and out.stop_reasons == ["stop", "env_error"]
    assert out.metrics["env/errors"] == 1
    assert (
        "ReturnsMessagesAlone.init: it returned a list of 2 messages, not the pair "
        "(messages, info); its trajectory ends with reward 0 (env_error)"
    ) in caplog.text
