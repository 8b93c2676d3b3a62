"""Native tool calls as the ``openai`` client sees them: a streamed tool-call reply rebuilds
the non-streamed one (logprobs and a null content included), ``parallel_tool_calls`` the
engines cannot honour is refused, and a ``role: tool`` message answering no call of the
assistant message before it is a 400 naming its ``tool_call_id``. The engine is scripted
(``scripted_engine``): it says what the prompt's last ``SAY:`` tells it."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest import endpoint
from scripted_engine import CALC, CALL, ScriptedEngine

ASK = [{"role": "user", "content": f"SAY:{CALL}"}]


@pytest.fixture
def scripted(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=1024, max_gen=256) as (url, backend):
        yield engine, url, backend


def test_a_streamed_tool_call_reply_rebuilds_the_whole_one_logprobs_included(scripted):
    # the stream sent logprobs only with a content delta: a reply that is only a tool call
    # streamed none (the whole reply has one per sampled token), and its role delta's
    # content "" made the rebuilt message's content "" where the whole one's is null
    engine, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    whole = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[CALC], logprobs=True
    ).choices[0]
    n_sampled = len(engine.tokenizer.encode(CALL, add_special_tokens=False)) + 1  # + EOS
    assert len(whole.logprobs.content) == n_sampled
    with client.chat.completions.stream(
        model="tiny", messages=ASK, tools=[CALC], logprobs=True
    ) as stream:
        for _ in stream:
            pass
        rebuilt = stream.get_final_completion().choices[0]
    assert rebuilt.finish_reason == "tool_calls" == whole.finish_reason
    assert rebuilt.message.content is None and whole.message.content is None
    (call,) = rebuilt.message.tool_calls
    assert (call.type, call.function.name) == ("function", "calculator")
    assert call.function.arguments == '{"expression": "2+2"}'
    assert [t.logprob for t in rebuilt.logprobs.content] == [-0.5] * n_sampled


def test_a_streamed_empty_reply_keeps_its_logprobs(scripted):
    # an empty reply (the scripted engine says "" then EOS) has no content delta: its
    # logprobs (the EOS token's) ride on the finish chunk
    _, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    say = [{"role": "user", "content": "SAY:"}]
    chunks = list(
        client.chat.completions.create(model="tiny", messages=say, logprobs=True, stream=True)
    )
    logprobs = [
        t.logprob for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert logprobs == [-0.5]  # EOS alone


@pytest.mark.parametrize(
    "value, message",
    [
        (False, "parallel_tool_calls False is not supported (only true: "),
        ("no", "parallel_tool_calls must be true or false, got 'no'"),
    ],
)
def test_parallel_tool_calls_that_cannot_be_honoured_is_a_400(scripted, value, message):
    # the model's reply held two calls and both were answered with parallel_tool_calls=False
    engine, url, _ = scripted
    body = {"model": "tiny", "messages": ASK, "tools": [CALC], "parallel_tool_calls": value}
    r = httpx.post(f"{url}/chat/completions", json=body)
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, "parallel_tool_calls"), r.text
    assert error["message"].startswith(message)
    assert engine.prompts == []


def test_parallel_tool_calls_false_without_tools_passes(scripted):
    # nothing to call: at most one call per reply holds (and with tool_choice none)
    _, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    say = [{"role": "user", "content": "SAY:hi"}]
    r = client.chat.completions.create(model="tiny", messages=say, parallel_tool_calls=False)
    assert r.choices[0].message.content == "hi"
    r = client.chat.completions.create(
        model="tiny", messages=say, tools=[CALC], tool_choice="none", parallel_tool_calls=False
    )
    assert r.choices[0].message.content == "hi"


def _called(call_id: str | None) -> list[dict]:
    call = {"type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    if call_id is not None:
        call["id"] = call_id
    return [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]


@pytest.mark.parametrize(
    "messages, message",
    [
        (  # another id than the call's
            [*_called("c1"), {"role": "tool", "tool_call_id": "c2", "content": "4"}],
            "messages[2].tool_call_id: 'c2' answers no tool call of messages[1] (its ids: 'c1')",
        ),
        (  # the second tool message of two answers no call either
            [
                *_called("c1"),
                {"role": "tool", "tool_call_id": "c1", "content": "4"},
                {"role": "tool", "tool_call_id": "c9", "content": "5"},
            ],
            "messages[3].tool_call_id: 'c9' answers no tool call of messages[1] (its ids: 'c1')",
        ),
        (  # no assistant message with tool calls before it
            [*ASK, {"role": "tool", "tool_call_id": "c1", "content": "4"}],
            "messages[1].tool_call_id: 'c1' answers no tool call: no assistant message with "
            "tool_calls comes just before it (tool messages aside)",
        ),
        (  # a user message in between
            [*_called("c1"), {"role": "user", "content": "x"},
             {"role": "tool", "tool_call_id": "c1", "content": "4"}],
            "messages[3].tool_call_id: 'c1' answers no tool call: no assistant message with "
            "tool_calls comes just before it (tool messages aside)",
        ),
    ],
)  # fmt: skip
def test_a_tool_message_answering_no_call_is_a_400_naming_its_tool_call_id(
    scripted, messages, message
):
    # OpenAI refuses these; they were rendered as if the call had been answered
    engine, url, _ = scripted
    body = {"model": "tiny", "messages": messages, "tools": [CALC]}
    r = httpx.post(f"{url}/chat/completions", json=body)
    error = r.json()["error"]
    assert r.status_code == 400, r.text
    assert (error["param"], error["message"]) == (message.split(":")[0], message)
    assert engine.prompts == []


def test_tool_messages_answering_the_calls_pass(scripted):
    # the openai client's own round trip: two calls answered in either order
    _, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    two = [{"role": "user", "content": f"SAY:{CALL}\n{CALL}"}]
    msg = client.chat.completions.create(model="tiny", messages=two, tools=[CALC])
    msg = msg.choices[0].message
    a, b = msg.tool_calls
    messages = [
        *two,
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": b.id, "content": "4"},
        {"role": "tool", "tool_call_id": a.id, "content": "SAY:four"},
    ]
    r = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])
    assert r.choices[0].message.content.startswith(
        "four"
    )  # then the template's "\n</tool_response>"
