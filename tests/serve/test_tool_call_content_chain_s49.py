"""A reply with text before its tool call, sent back by the agent, continues the session's
row. The hermes parser's content is all the text before ``<tool_call>``, the newline the
model wrote before the call included; Qwen2.5's template (the tiny model's) renders an
assistant message as ``'\\n' + content + '\\n<tool_call>'``, so the reply came back with
two newlines where the model sampled one and every such turn forked the row
(``rerendered``). The engine is scripted (``scripted_engine``): it says what the prompt's
last ``SAY:`` tells it."""

from __future__ import annotations

import openai
from conftest import endpoint
from scripted_engine import CALC, CALL, ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session

THOUGHT = "Let me compute."


def test_text_before_a_tool_call_comes_back_as_sampled_and_the_row_goes_on(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=1024, max_gen=256) as (url, backend):
        session, (a, b) = call_then_answer(engine, url, backend)
    assert (b.decision.kind, b.decision.reason) == ("append", "")
    assert session.chain is not None and session.chain.counts["fork"] == 0
    # the engine's second prompt is its first + the tokens it sampled, then the tool result
    chain = engine.prompts[0] + a.response_ids
    assert engine.prompts[1][: len(chain)] == chain


def call_then_answer(engine, url, backend):
    """A session's reply with text before its call, sent back with the call's result; the
    session and its two records."""
    row = PromptRow("q", "toy", {}, uid="p7")
    session = backend.sessions.open(
        Session(row, 0, SamplingParams(temperature=1.0, seed=11), EngineBinding(engine))
    )
    client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": f"SAY:{THOUGHT}\n{CALL}"}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])
    msg = first.choices[0].message
    # the newline between the text and the call is the template's, not the content's
    assert msg.content == THOUGHT
    (call,) = msg.tool_calls
    messages += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "4 SAY:four"},
    ]
    client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])
    return session, session.records


def test_only_the_separator_the_template_puts_back_is_left_out(tiny_tokenizer):
    # two newlines before the call: the template writes one of them, the content keeps the
    # other (sent back, it renders to the sampled text)
    ask = [{"role": "user", "content": f"SAY:{THOUGHT}\n\n{CALL}"}]
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=1024, max_gen=256) as (url, _):
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=120)
        msg = client.chat.completions.create(model="tiny", messages=ask, tools=[CALC])
    assert msg.choices[0].message.content == THOUGHT + "\n"
