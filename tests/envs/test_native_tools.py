"""The tools env with native tool calls (the tiny template renders tools in Qwen2.5's format,
vLLM's hermes parser reads the calls) and its fallback to the tag protocol on a template
without tool support; the choice is made per env and logged."""

from __future__ import annotations

import logging

import pytest
from transformers import AutoTokenizer

from skyrl.data.prompts import PromptRow
from skyrl.envs.tool_env import NATIVE_SYSTEM_PROMPT, SYSTEM_PROMPT, ToolEnv
from skyrl.generators import AgentLoop, LoopSettings, tool_calls
from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.local import LocalEngine, run_serving
from skyrl.models import build_tiny_model

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
PLAIN_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class Replies(LocalEngine):
    """Answers the k-th request of the run with ``replies[k]`` (+ EOS); keeps the prompts."""

    def __init__(self, tok, replies):
        super().__init__()
        self.tok, self.replies, self.prompts = tok, list(replies), []

    def _serve_until(self, done):
        while not done.done():
            for r in self.take(block=True):
                text = self.replies[len(self.prompts)]
                self.prompts.append(r.prompt_ids)
                ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
                r.resolve(Completion(ids, [-0.1] * len(ids), "stop"))


@pytest.fixture
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def run(tok, replies, **env_kwargs):
    engine = Replies(tok, replies)
    loop = AgentLoop(engine, tok, lambda: ToolEnv(**env_kwargs), LoopSettings(4096, 512, 3, 10.0))
    row = PromptRow("What is 6 * 7?", "toy", {"answer": "42"}, uid="p0")
    (traj,) = run_serving(engine, loop.run([row], 1, SamplingParams(max_tokens=128)))
    return traj, engine


def test_native_calls_are_declared_parsed_and_answered(tok, caplog):
    tool_calls._logged.clear()  # the choice is logged once per process
    with caplog.at_level(logging.WARNING):
        traj, engine = run(tok, [CALL, "<answer>42</answer>"])
    assert traj.reward == 1.0 and len(traj.turns) == 2 and traj.env_errors == 0
    first = tok.decode(engine.prompts[0])
    assert "<tools>" in first and '"name": "calculator"' in first and NATIVE_SYSTEM_PROMPT in first
    assert "<calculator>" not in first  # the tag protocol is not told
    back = tok.decode(traj.turns[0].appended_ids)
    assert "<tool_response>\n42\n</tool_response>" in back
    # the second request extends the first + the sampled call exactly
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]
    assert "ToolEnv: native tool calls" in caplog.text and "'hermes' tool parser" in caplog.text


def test_bad_native_calls_come_back_as_errors(tok):
    unknown = CALL.replace('"calculator"', '"search"')
    bad_args = CALL.replace('"expression"', '"expr"')
    traj, _ = run(tok, [unknown, bad_args, "<answer>42</answer>"])
    notes = [tok.decode(t.appended_ids) for t in traj.turns[:2]]
    assert "no tool named 'search'" in notes[0]
    assert "calculator takes {'expression': string}" in notes[1]
    assert traj.reward == 1.0


def test_a_template_without_tools_falls_back_to_tags(tok, caplog):
    tok.chat_template = PLAIN_CHATML
    tool_calls._logged.clear()
    with caplog.at_level(logging.WARNING):
        traj, engine = run(tok, ["<calculator>6 * 7</calculator>", "<answer>42</answer>"])
    assert (
        "its own tool-call text protocol (the chat template does not render tools)" in caplog.text
    )
    first = tok.decode(engine.prompts[0])
    assert SYSTEM_PROMPT in first and "<tools>" not in first
    assert "42" in tok.decode(traj.turns[0].appended_ids) and traj.reward == 1.0


def test_tags_can_be_forced_and_native_refuses_a_template_without_tools(tok):
    traj, engine = run(
        tok, ["<calculator>6 * 7</calculator>", "<answer>42</answer>"], tool_format="tags"
    )
    assert SYSTEM_PROMPT in tok.decode(engine.prompts[0]) and traj.reward == 1.0
    tok.chat_template = PLAIN_CHATML
    with pytest.raises(
        ValueError, match="tool_format=native, but the chat template does not render tools"
    ):
        run(tok, ["x"], tool_format="native")
