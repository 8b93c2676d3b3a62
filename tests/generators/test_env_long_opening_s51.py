"""An env whose ``init`` returns a longer opening than the one the load check measured (random
few-shot examples, say) past ``generator.max_prompt_length`` ends that trajectory as an env
error, logged once, as any unusable env result does. Before, the loop raised a bare
``ValueError`` that stopped the whole run. (``make``'s max_prompt_length is 256 tokens.)"""

import logging

from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.inference.base import SamplingParams

ROWS = [PromptRow("ok", "s", {}, uid="ok"), PromptRow("long", "s", {"long": True}, uid="long")]


class LongOpening(TextEnv):
    """The row marked ``long`` opens with 400 words: over 256 tokens."""

    def init(self, prompt, extras):
        messages, info = super().init(prompt, extras)
        if extras.get("long"):
            messages = [{"role": "user", "content": "word " * 400}]
        return messages, info

    def step(self, action_text):
        return StepResult([], 1.0, True)


def test_an_opening_past_max_prompt_length_ends_its_own_trajectory_only(tok, caplog):
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), LongOpening, False).generate(ROWS, 2, SamplingParams())
    assert out.rewards == [1.0, 1.0, 0.0, 0.0]
    assert out.stop_reasons == ["stop", "stop", "env_error", "env_error"]
    assert out.metrics["env/errors"] == 2.0
    [logged] = [r.getMessage() for r in caplog.records if r.name == "skyrl.generators.agent_loop"]
    assert logged.startswith("LongOpening.init: ")
    assert "its opening is longer than generator.max_prompt_length=256 tokens" in logged
    assert logged.endswith("; its trajectory ends with reward 0 (env_error)")
