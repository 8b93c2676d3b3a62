"""Tool calls in the model's own format (Qwen2.5/hermes `<tool_call>` JSON, parsed by vLLM's
parser), a dead engine (503), malformed requests (400 before the engine) and unexpected
failures (a JSON 500), and training sessions: the API key picks the session, the
sampling-drift rule, the token budget, and what is recorded. The engine is scripted
(``scripted_engine``) so replies are known."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'


@pytest.fixture
def scripted(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=512, max_gen=256) as (url, backend):
        yield engine, url, backend


def test_a_tool_call_is_parsed_into_tool_calls(scripted):
    _, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": f"SAY:{CALL}"}], tools=[CALC]
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "calculator" and call.id
    assert json.loads(call.function.arguments) == {"expression": "2+2"}
    # without tools the same text is plain content
    plain = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": f"SAY:{CALL}"}]
    )
    assert plain.choices[0].message.content == CALL and not plain.choices[0].message.tool_calls


def test_tool_calls_stream_as_a_delta(scripted):
    _, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"SAY:{CALL}"}], tools=[CALC],
            stream=True,
        )
    )  # fmt: skip
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["calculator"]
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "tool_calls"
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]


def test_a_dead_engine_is_a_503(tiny_tokenizer):
    with endpoint(ScriptedEngine(tiny_tokenizer, dead=True), tiny_tokenizer) as (url, _):
        r = httpx.post(
            f"{url}/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
        )
    assert r.status_code == 503 and "died" in r.json()["error"]["message"]


def open_session(backend, engine, drift="error", temperature=1.0):
    row = PromptRow("q", "toy", {}, uid="p7")
    sampling = SamplingParams(temperature=temperature, seed=11)
    return backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine), drift=drift))


def call_then_answer(client, said: str, tool_result: str):
    """Ask the scripted engine to say ``said`` (a tool call), send the call back with
    ``tool_result``; the second reply."""
    messages = [{"role": "user", "content": f"SAY:{said}"}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])
    call = first.choices[0].message.tool_calls[0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": tool_result},
    ]
    return client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])


def test_the_session_key_records_the_requests_and_tool_calls_chain(scripted):
    engine, url, backend = scripted
    session = open_session(backend, engine)
    client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
    second = call_then_answer(client, CALL, "4 SAY:four")
    assert second.choices[0].message.content.startswith("four")
    a, b = session.records
    # the template re-renders the call as the model wrote it: the chain goes on, and the
    # engine's second prompt starts with exactly the first prompt + the sampled tokens
    assert b.decision.kind in ("append", "realigned")
    assert engine.prompts[-1][: len(engine.prompts[-2]) + len(a.response_ids)] == (
        engine.prompts[-2] + a.response_ids
    )
    assert a.reply["tool_calls"][0]["function"]["name"] == "calculator"
    assert a.response_ids[-1] == engine.tokenizer.eos_token_id and a.finish_reason == "stop"
    # another key is not this session: requests without a session still work here
    other = openai.OpenAI(base_url=url, api_key="not-a-session", max_retries=0)
    other.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert len(session.records) == 2


def test_a_call_serialized_differently_forks(scripted):
    engine, url, backend = scripted
    session = open_session(backend, engine)
    client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
    compact = '<tool_call>\n{"name":"calculator","arguments":{"expression":"2+2"}}\n</tool_call>'
    call_then_answer(client, compact, "4")
    second = session.records[1].decision
    assert (second.kind, second.reason) == ("fork", "rerendered")  # the template adds spaces


def test_a_drifting_temperature_is_refused_or_overridden_and_counted(scripted):
    engine, url, backend = scripted
    strict = open_session(backend, engine)
    client = openai.OpenAI(base_url=url, api_key=strict.key, max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="generator.agent_sampling_drift=override"):
        client.chat.completions.create(model="tiny", messages=hi, temperature=0.3)
    client.chat.completions.create(model="tiny", messages=hi, temperature=1.0)  # the same: fine
    with pytest.raises(openai.BadRequestError, match="temperature must be a number"):
        client.chat.completions.create(model="tiny", messages=hi, temperature="warm")
    assert len(strict.records) == 1 and strict.sampling_overrides == 0
    loose = open_session(backend, engine, drift="override")
    client = openai.OpenAI(base_url=url, api_key=loose.key, max_retries=0)
    client.chat.completions.create(model="tiny", messages=hi, temperature=0.3, top_p=0.5)
    assert loose.sampling_overrides == 2  # temperature and top_p, both set back


def test_session_budget_caps_max_tokens_and_refuses_when_spent(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=128, max_gen=12) as (url, backend):
        session = open_session(backend, engine)
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        long_reply = "SAY:" + "abc " * 20
        messages = [{"role": "user", "content": long_reply}]
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=500)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "more"},
        ]
        with pytest.raises(openai.BadRequestError, match="generator.max_generate_length=12"):
            client.chat.completions.create(model="tiny", messages=messages)


def test_n_above_one_is_refused_in_a_session(scripted):
    engine, url, backend = scripted
    session = open_session(backend, engine)
    client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], n=2
        )


X = {"role": "user", "content": "x"}
CHAT = "chat/completions"


def after(message: dict) -> dict:
    """A chat request whose second message is ``message``."""
    return {"messages": [X, message]}


def declaring(tool_type: str = "function", **function) -> dict:
    """A chat request declaring one tool with these ``function`` fields."""
    tool = {"type": tool_type, "function": {"name": "calculator", **function}}
    return {"messages": [X], "tools": [tool]}


ARGS_5 = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}


@pytest.mark.parametrize(
    "route, body, param",
    [
        (CHAT, after({"role": "assistant", "tool_calls": 5}), "messages[1].tool_calls"),
        (CHAT, after(ARGS_5), "messages[1].tool_calls[0].function.arguments"),
        (
            CHAT,
            after({"role": "tool", "tool_call_id": 7, "content": "4"}),
            "messages[1].tool_call_id",
        ),
        (CHAT, declaring(parameters="not-a-schema"), "tools[0].function.parameters"),
        (CHAT, declaring(description=5), "tools[0].function.description"),
        (CHAT, declaring(strict="yes"), "tools[0].function.strict"),
        (CHAT, declaring("retrieval"), "tools[0].type"),
        ("completions", {"prompt": ""}, "prompt"),
        ("completions", {"prompt": [5, -1]}, "prompt[1]"),
        ("completions", {"prompt": [5, 10**9]}, "prompt[1]"),
    ],
)
def test_a_malformed_request_is_a_400_before_the_engine_and_the_session(
    scripted, route, body, param
):
    """The error object names the field, and nothing ran: no engine call, no recorded turn,
    no chain (a session's chain is made by its first sampled request)."""
    engine, url, backend = scripted
    session = open_session(backend, engine)
    r = httpx.post(
        f"{url}/{route}", json={"model": "tiny", **body},
        headers={"Authorization": f"Bearer {session.key}"},
    )  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, None)
    assert param in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert engine.prompts == [] and session.records == [] and session.chain is None


def test_a_seed_beyond_64_bits_is_a_400_without_a_session(scripted):
    engine, url, _ = scripted
    r = httpx.post(f"{url}/{CHAT}", json={"model": "tiny", "messages": [X], "seed": 2**64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    assert engine.prompts == []


def test_a_reply_the_tool_parser_fails_on_is_plain_content_and_recorded_as_such(
    scripted, monkeypatch, caplog
):
    # the parser reads what the model wrote: failing on it is not the client's fault nor
    # a reason to lose a turn a training session already recorded
    engine, url, backend = scripted
    parser = backend.format.parser
    assert parser.unavailable() is None

    def broken(self, text, request):
        raise ValueError("parser bug")

    monkeypatch.setattr(parser._cls, "extract_tool_calls", broken)
    session = open_session(backend, engine)
    client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.tool_calls"):
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"SAY:{CALL}"}], tools=[CALC]
        )
    choice = r.choices[0]
    assert choice.message.content == CALL and not choice.message.tool_calls
    assert choice.finish_reason == "stop"
    (record,) = session.records
    assert record.reply == {"role": "assistant", "content": CALL}
    assert "'hermes' tool parser failed" in caplog.text and "parser bug" in caplog.text


def test_an_unexpected_failure_is_a_json_500_with_the_traceback_kept_in_the_log(
    scripted, monkeypatch, caplog
):
    _, url, backend = scripted

    def broken(*args):
        raise RuntimeError("internal detail")

    monkeypatch.setattr(backend.format, "parse_reply", broken)
    with caplog.at_level(logging.ERROR, logger="skyrl.serve.app"):
        r = httpx.post(f"{url}/{CHAT}", json={"model": "tiny", "messages": [X]})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert error["type"] == "server_error" and set(error) == {"message", "type", "param", "code"}
    assert "internal detail" not in r.text
    (logged,) = [rec for rec in caplog.records if rec.name == "skyrl.serve.app"]
    assert logged.exc_info and "internal detail" in str(logged.exc_info[1])


def test_a_conversation_the_chat_template_refuses_is_a_400(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)  # own copy: its template changes
    tokenizer.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    engine = ScriptedEngine(tokenizer)
    with endpoint(engine, tokenizer) as (url, _):
        r = httpx.post(f"{url}/{CHAT}", json={"model": "tiny", "messages": [X]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and "roles must alternate" in error["message"]
    assert engine.prompts == []
