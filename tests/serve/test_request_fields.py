"""OpenAI request fields as the endpoint reads them: stop strings left out of the text (and a
session's next request realigned after it), fields it cannot honour refused by name while
their default values pass, ``logprobs=0`` and the completions stream's usage, ``max_tokens``
beside a null ``max_completion_tokens``, and non-finite numbers. The engine is scripted
(``scripted_engine``) so replies are known."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session

REACT = "SAY:Action: look\nObservation: made up"
"""A reply that goes on past its stop string ``\\nObservation:``."""


@pytest.fixture
def scripted(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=512, max_gen=64) as (url, backend):
        yield engine, url, backend


def post(url: str, route: str, body: dict, key: str = "k") -> httpx.Response:
    """``body`` as Python's json writes it (NaN and Infinity included; httpx refuses them)."""
    return httpx.post(
        f"{url}/{route}", content=json.dumps({"model": "tiny", **body}),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
        timeout=60,  # the first request declaring tools imports the tool parser
    )  # fmt: skip


def test_a_stop_string_is_left_out_of_the_text_and_kept_in_the_token_ids(scripted):
    engine, url, _ = scripted
    tok = engine.tokenizer
    sampled = tok.encode("Action: look\nObservation:", add_special_tokens=False)
    stop = ["\nObservation:"]
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": REACT}]
    ids = {"return_token_ids": True}
    r = client.chat.completions.create(model="tiny", messages=messages, stop=stop, extra_body=ids)
    (choice,) = r.choices
    assert (choice.message.content, choice.finish_reason) == ("Action: look", "stop")
    assert choice.token_ids == sampled and r.usage.completion_tokens == len(sampled)
    r = client.completions.create(model="tiny", prompt=REACT, stop=stop, extra_body=ids)
    assert (r.choices[0].text, r.choices[0].token_ids) == ("Action: look", sampled)
    # the stream gives the same text
    chunks = client.chat.completions.create(model="tiny", messages=messages, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Action: look"
    )


def test_a_session_reply_sent_back_without_its_stop_string_continues_the_row(scripted):
    """The agent sends back the text it was given; the engine's next prompt is the first
    prompt + everything sampled (the stop string included) + the template after the reply,
    one training row, as the built-in loop makes it."""
    from skyrl.generators import Trajectory, trajectories_to_output
    from skyrl.serve.reconcile import to_turns

    engine, url, backend = scripted
    tok = engine.tokenizer
    row = PromptRow("q", "toy", {}, uid="p7")
    sampling = SamplingParams(seed=11, stop=["\nObservation:"])  # the training stop string
    session = backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine)))
    client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
    messages = [{"role": "user", "content": REACT}]
    r = client.chat.completions.create(model="tiny", messages=messages)
    assert r.choices[0].message.content == "Action: look"
    messages += [r.choices[0].message.model_dump(), {"role": "user", "content": "SAY:done"}]
    client.chat.completions.create(model="tiny", messages=messages)
    first, second = session.records
    assert first.reply["content"] == "Action: look"
    assert first.response_ids == tok.encode("Action: look\nObservation:", add_special_tokens=False)
    tail = "<|im_end|>\n<|im_start|>user\nSAY:done<|im_end|>\n<|im_start|>assistant\n"
    assert second.decision.kind == "realigned"
    assert engine.prompts[-1] == engine.prompts[0] + first.response_ids + tok.encode(
        tail, add_special_tokens=False
    )
    out = trajectories_to_output(
        [Trajectory(row, "p7/0", to_turns(session.records), 1.0, "stop")], step_wise=False
    )
    assert out.forks == [""]  # one row: prompt, sampled (stop string too), template, sampled
    assert out.prompt_token_ids[0] + out.response_token_ids[0] == (
        engine.prompts[-1] + second.response_ids
    )


def test_the_default_values_of_the_fields_refused_otherwise_pass(scripted):
    engine, url, _ = scripted
    calc = {"type": "function", "function": {"name": "calculator"}}
    defaults = {
        "tools": [calc], "tool_choice": "auto", "parallel_tool_calls": True,
        "response_format": {"type": "text"}, "presence_penalty": 0, "frequency_penalty": 0.0,
        "logit_bias": {}, "logprobs": True, "top_logprobs": 0,
    }  # fmt: skip
    say = [{"role": "user", "content": "SAY:hi"}]
    r = post(url, "chat/completions", {"messages": say, **defaults})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi", r.text
    nulls = {k: None for k in ("tool_choice", "response_format", "logit_bias", "top_logprobs")}
    r = post(url, "chat/completions", {"messages": say, **nulls})
    assert r.status_code == 200, r.text
    r = post(url, "completions", {"prompt": "SAY:hi", "logit_bias": None, "presence_penalty": 0})
    assert r.status_code == 200, r.text
    old_defaults = {"best_of": 1, "suffix": None}  # the completions API's own defaults
    r = post(url, "completions", {"prompt": "SAY:hi", **old_defaults})
    assert r.status_code == 200, r.text
    r = post(url, "chat/completions", {"messages": say, "functions": None, "function_call": "auto"})
    assert r.status_code == 200, r.text
    # tool_choice none: the tools are rendered (as vLLM's server does), the reply is content
    r = post(url, "chat/completions", {"messages": say, "tools": [calc], "tool_choice": "none"})
    assert r.status_code == 200 and "calculator" in engine.tokenizer.decode(engine.prompts[-1])


def test_completions_logprobs_zero_gives_the_sampled_tokens_logprobs(scripted):
    engine, url, _ = scripted
    r = post(url, "completions", {"prompt": "SAY:hi", "logprobs": 0})
    logprobs = r.json()["choices"][0]["logprobs"]
    # "h" "i" EOS, the scripted engine's logprob -0.5 each
    assert logprobs["tokens"] == ["h", "i", engine.tokenizer.eos_token]
    assert logprobs["token_logprobs"] == [-0.5, -0.5, -0.5]
    assert logprobs["text_offset"] == [0, 1, 2]
    r = post(url, "completions", {"prompt": "SAY:hi"})
    assert r.json()["choices"][0]["logprobs"] is None


def test_the_completions_stream_ends_with_usage_when_asked(scripted):
    _, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    asked = list(
        client.completions.create(
            model="tiny", prompt="SAY:hi", stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    # the tiny tokenizer's tokens: the prompt S A Y : h i (6), the reply h i EOS (3)
    assert [c.usage for c in asked[:-1]] == [None] * (len(asked) - 1)
    usage = asked[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (6, 3, 9)
    assert asked[-1].choices == []
    plain = list(client.completions.create(model="tiny", prompt="SAY:hi", stream=True))
    assert all(c.usage is None for c in plain) and len(plain) == len(asked) - 1


def test_max_tokens_is_read_when_max_completion_tokens_is_null(scripted):
    engine, url, _ = scripted
    say = [{"role": "user", "content": "SAY:" + "abc " * 20}]
    body = {"messages": say, "max_tokens": 5, "max_completion_tokens": None}
    r = post(url, "chat/completions", body)
    assert r.json()["usage"]["completion_tokens"] == 5 and engine.samplings[-1].max_tokens == 5
    body = {"messages": say, "max_tokens": 5, "max_completion_tokens": 7}
    post(url, "chat/completions", body)
    assert engine.samplings[-1].max_tokens == 7  # max_completion_tokens wins when given


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", float("nan")),
        ("top_p", float("nan")),
        ("max_tokens", float("inf")),
        ("seed", float("inf")),
        ("seed", float("-inf")),
        ("n", float("nan")),
    ],
)
def test_a_non_finite_number_is_a_400_naming_the_field(scripted, field, value):
    engine, url, _ = scripted
    r = post(
        url, "chat/completions", {"messages": [{"role": "user", "content": "x"}], field: value}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and "finite" in error["message"], error
    assert engine.prompts == []


def test_a_non_finite_temperature_in_a_session_is_a_400(scripted):
    engine, url, backend = scripted
    row = PromptRow("q", "toy", {}, uid="p7")
    session = backend.sessions.open(Session(row, 0, SamplingParams(seed=1), EngineBinding(engine)))
    body = {"messages": [{"role": "user", "content": "x"}], "temperature": float("nan")}
    r = post(url, "chat/completions", body, key=session.key)
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, "temperature") and "finite" in error["message"]
    assert engine.prompts == [] and session.records == []


@pytest.mark.parametrize("stop", ["", ["\n", ""]])
def test_an_empty_stop_string_is_a_400(scripted, stop):
    # every text holds "": each reply would end at its first token (vLLM refuses it too)
    engine, url, _ = scripted
    r = post(
        url, "chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop": stop}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stop" and "empty" in error["message"], error
    assert engine.prompts == []


@pytest.mark.parametrize("top_p", [0, 1.5])
def test_a_top_p_out_of_range_is_a_400_not_a_500(scripted, top_p):
    # checked after the sampling parameters were built, whose own check raised first: a 500
    engine, url, _ = scripted
    body = {"messages": [{"role": "user", "content": "x"}], "top_p": top_p}
    r = post(url, "chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "top_p"
    assert error["message"] == f"top_p must be in (0, 1], got {float(top_p)}"
    assert engine.prompts == []


def test_a_temperature_vllm_would_raise_is_a_400(scripted):
    # vLLM raises 0 < T < 0.01 to 0.01: the reply would come from another temperature
    engine, url, _ = scripted
    body = {"messages": [{"role": "user", "content": "x"}], "temperature": 0.005}
    r = post(url, "chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "temperature"
    assert error["message"].startswith("temperature must be 0 (greedy) or >= 0.01, got 0.005")
    assert engine.prompts == []


def test_max_completion_tokens_over_the_limit_is_named_as_sent(scripted):
    engine, url, _ = scripted
    body = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 65}
    r = post(url, "chat/completions", body)  # the fixture's max_generate_length is 64
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, "max_completion_tokens"), r.text
    assert error["message"] == "max_completion_tokens 65 is over generator.max_generate_length=64"
    assert engine.prompts == []


@pytest.mark.parametrize("part", [{"type": "text", "text": 5}, {"type": "text"}])
def test_a_text_part_without_a_string_text_is_a_400(scripted, part):
    engine, url, _ = scripted
    r = post(url, "chat/completions", {"messages": [{"role": "user", "content": [part]}]})
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, "messages[0].content[0].text"), r.text
    assert "must be a string" in error["message"]
    assert engine.prompts == []


@pytest.mark.parametrize(
    "route, field, value",
    [
        ("chat/completions", "stream", "false"),  # was read as true: a stream came back
        ("chat/completions", "logprobs", "yes"),
        ("chat/completions", "return_token_ids", 1),
        ("completions", "stream", "true"),
        ("completions", "echo", "no"),  # was refused as if echo were asked
        ("completions", "return_token_ids", "false"),
    ],
)
def test_a_flag_that_is_not_a_boolean_is_a_400_before_the_engine(scripted, route, field, value):
    engine, url, backend = scripted
    row = PromptRow("q", "toy", {}, uid="p7")
    session = backend.sessions.open(Session(row, 0, SamplingParams(seed=1), EngineBinding(engine)))
    sent = (
        {"messages": [{"role": "user", "content": "x"}]}
        if route.startswith("chat")
        else {"prompt": "x"}
    )
    r = post(url, route, {**sent, field: value}, key=session.key)
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, field), r.text
    assert error["message"] == f"{field} must be true or false, got {value!r}"
    assert engine.prompts == [] and session.records == []


def test_a_session_records_the_messages_as_the_client_sent_them(scripted):
    """``RequestRecord.messages`` (what ``generator.agent_reward_fn`` gets, with the reply) are
    the OpenAI messages as sent: not the template's form (developer as system, parts joined,
    a null content as "", tool-call arguments parsed into objects)."""
    engine, url, backend = scripted
    row = PromptRow("q", "toy", {}, uid="p7")
    session = backend.sessions.open(Session(row, 0, SamplingParams(seed=1), EngineBinding(engine)))
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    sent = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "SAY:"}, {"type": "text", "text": "x"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "SAY:hi"},
    ]  # fmt: skip
    r = post(url, "chat/completions", {"messages": sent}, key=session.key)
    assert r.status_code == 200, r.text
    (record,) = session.records
    assert record.messages == sent
    assert record.reply == {"role": "assistant", "content": "hi"}


def test_the_chat_stream_ends_with_usage_only_when_asked(scripted):
    """As OpenAI streams: a usage chunk (with no choices) only with
    ``stream_options.include_usage``; the quickstart's ``chunk.choices[0]`` on every chunk of a
    plain stream then works."""
    _, url, _ = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    say = [{"role": "user", "content": "SAY:hi"}]
    whole = client.chat.completions.create(model="tiny", messages=say)
    plain = list(client.chat.completions.create(model="tiny", messages=say, stream=True))
    assert all(c.choices and c.usage is None for c in plain)
    assert "".join(c.choices[0].delta.content or "" for c in plain) == "hi"
    options = {"include_usage": True}
    asked = list(
        client.chat.completions.create(
            model="tiny", messages=say, stream=True, stream_options=options
        )
    )
    assert len(asked) == len(plain) + 1 and asked[-1].choices == []
    assert asked[-1].usage == whole.usage  # "h" "i" <|im_end|>: 3 completion tokens
    assert whole.usage.completion_tokens == 3


@pytest.mark.parametrize("n", [129, 1e20])
def test_n_over_openais_limit_is_a_400_and_the_endpoint_still_answers(scripted, n):
    # n=1e20 made 1e20 engine calls on the server's loop: every later request timed out
    engine, url, _ = scripted
    r = post(url, "chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": n})
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, "n"), r.text
    assert error["message"] == f"n must be <= 128 (as in OpenAI's API), got {int(n)}"
    assert httpx.get(f"{url}/models", timeout=5).status_code == 200
    assert engine.prompts == []
