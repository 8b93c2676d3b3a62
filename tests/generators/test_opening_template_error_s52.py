"""An opening the chat template refuses (its ``raise_exception``: roles that do not alternate)
ends that trajectory as an env error, logged once on one line, as an opening longer than
``max_prompt_length`` does: the load check renders every row's opening with the same calls,
so only an env whose ``init`` varies gets here, and the template's error stopped the run."""

import copy
import logging

from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.inference.base import SamplingParams

REFUSE = (
    "{% if loop.index0 > 0 and message['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}"
)


class FewShot(TextEnv):
    """Opens with the question, after a second user message on the rows that ask for it (an
    opening that varies: a few-shot example picked at random, say)."""

    def init(self, prompt, extras):
        messages, info = super().init(prompt, extras)
        if extras.get("twice"):
            messages.insert(0, {"role": "user", "content": "Example: 1+1 is 2."})
        return messages, info

    def step(self, action_text):
        return StepResult([], 1.0, True)


def test_an_opening_the_template_refuses_is_an_env_error(tok, caplog):
    strict = copy.deepcopy(tok)
    loop = "{%- for message in messages %}"
    strict.chat_template = strict.chat_template.replace(loop, loop + REFUSE, 1)
    assert REFUSE in strict.chat_template  # the template has the loop this edits
    rows = [
        PromptRow("a", "s", {}, uid="ok"),
        PromptRow("b", "s", {"twice": True}, uid="bad"),
        PromptRow("c", "s", {"twice": True}, uid="bad2"),
    ]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(strict, FakeEngine(strict), FewShot, True).generate(rows, 1, SamplingParams())
    rows_seen = [(r, s, len(p) > 0) for r, s, p in zip(
        out.rewards, out.stop_reasons, out.prompt_token_ids, strict=True
    )]  # fmt: skip
    assert rows_seen == [(1.0, "stop", True), (0.0, "env_error", False), (0.0, "env_error", False)]
    assert out.metrics["env/errors"] == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("FewShot.init")]
    assert lines == [
        "FewShot.init: the chat template cannot render its opening (TemplateError: Conversation "
        "roles must alternate user/assistant/user/assistant); its trajectory ends with reward 0 "
        "(env_error)"
    ]
