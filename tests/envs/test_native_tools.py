"""The tools env with native tool calls (the tiny template renders tools in Qwen2.5's format,
vLLM's hermes parser reads the calls) and its fallback to the tag protocol on a template
without tool support; the choice is made per env and logged."""

from __future__ import annotations

import logging

import pytest
from transformers import AutoTokenizer

from skyrl.data.generated import ARITHMETIC_SYSTEM_PROMPT, arithmetic_rows
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


def run(tok, replies, row=None, **env_kwargs):
    engine = Replies(tok, replies)
    settings = LoopSettings(4096, 512, 3, env_kwargs.get("step_timeout_s", 10.0))
    loop = AgentLoop(engine, tok, lambda: ToolEnv(**env_kwargs), settings)
    row = row or PromptRow("What is 6 * 7?", "toy", {"answer": "42"}, uid="p0")
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


@pytest.mark.parametrize("tool_format", ["tags", "native"])
def test_a_row_with_its_own_system_message_is_told_about_the_tools(tok, tool_format):
    # experiment=multi_turn_tools: the arithmetic rows open with a system message
    (row,) = arithmetic_rows(1, seed=0)
    _, engine = run(tok, ["<answer>0</answer>"], row=row, tool_format=tool_format)
    first = tok.decode(engine.prompts[0])
    # one system message: the row's own text, a blank line, then the tools prompt
    tools_prompt = SYSTEM_PROMPT if tool_format == "tags" else NATIVE_SYSTEM_PROMPT
    assert first.count("<|im_start|>system") == 1
    assert f"{ARITHMETIC_SYSTEM_PROMPT}\n\n{tools_prompt}" in first
    # the tag protocol only where the model calls tools by tags (native: the template's <tools>)
    assert ("<calculator>" in first) == (tool_format == "tags")
    assert ("<tools>" in first) == (tool_format == "native")


def test_a_custom_system_prompt_is_added_to_the_rows_own(tok):
    (row,) = arithmetic_rows(1, seed=0)
    _, engine = run(tok, ["<answer>0</answer>"], row=row, system_prompt="Use the tools.")
    assert f"{ARITHMETIC_SYSTEM_PROMPT}\n\nUse the tools." in tok.decode(engine.prompts[0])
    # and without a system message of its own, the custom prompt is the system message
    _, engine = run(tok, ["<answer>0</answer>"], system_prompt="Use the tools.")
    assert tok.decode(engine.prompts[0]).startswith("<|im_start|>system\nUse the tools.\n")


def test_slow_calls_in_one_reply_time_out_within_the_env_step_limit(tok):
    # 3 calls of a tool that sleeps 20 s, 4 s each, would run 12 s: past the loop's 10 s
    # limit on env.step, which would cancel the step (reward 0, an env error). They share a
    # deadline at 10 - min(1, 10 / 10) = 9 s instead, and the episode goes on to its answer.
    # (At a 3 s limit the margin, 0.3 s, was missed on a machine loaded 5x over its cores.)
    sleep = CALL.replace('"calculator"', '"python"').replace(
        '"expression": "6 * 7"', '"code": "import time; time.sleep(20)"'
    )
    replies = ["\n".join([sleep] * 3), "<answer>42</answer>"]
    traj, _ = run(tok, replies, tool_timeout_s=4.0, step_timeout_s=10.0)
    assert traj.env_errors == 0 and traj.reward == 1.0 and len(traj.turns) == 2
    notes = tok.decode(traj.turns[0].appended_ids).split("<tool_response>\n")[1:]
    assert len(notes) == 3 and notes[0].startswith("error: timed out after 4 s")
    assert all(n.startswith(("error: timed out after ", "error: not run")) for n in notes)


def test_a_call_in_special_tokens_reaches_the_parser(tok):
    """Some models' ``<tool_call>``/``</tool_call>`` are special tokens (vLLM's hermes parser
    keeps special tokens for them). The reply was decoded without special tokens, the env
    saw no call, and the episode ended unanswered with reward 0; now the call runs and the
    answer after it scores 1, as with plain-text markers."""
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    assert len(tok.encode("<tool_call>", add_special_tokens=False)) == 1
    traj, _ = run(tok, [CALL, "<answer>42</answer>"], tool_format="native")
    assert len(traj.turns) == 2 and traj.reward == 1.0 and traj.env_errors == 0
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(traj.turns[0].appended_ids)
