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
from scripted_engine import CALC, CALL, ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session


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


def test_max_tokens_per_turn_caps_every_request_with_or_without_a_session(tiny_tokenizer):
    # skyrl-serve passes generator.max_tokens_per_turn in, but requests without a session
    # (every skyrl-serve request) were capped by max_generate_length only: [64, 40, 5, 8]
    engine = ScriptedEngine(tiny_tokenizer)
    long_reply = "SAY:" + "abc " * 20  # well over 8 tokens: a reply capped at 8 is cut
    limits = {"max_prompt": 128, "max_gen": 64, "max_per_turn": 8}
    with endpoint(engine, tiny_tokenizer, **limits) as (url, backend):
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
        messages = [{"role": "user", "content": long_reply}]
        r = client.chat.completions.create(model="tiny", messages=messages)  # min(64, 8) = 8
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
        c = client.completions.create(model="tiny", prompt=long_reply, max_tokens=40)
        assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 8
        client.completions.create(model="tiny", prompt=long_reply, max_tokens=5)  # 5 < 8: 5
        with pytest.raises(openai.BadRequestError, match="generator.max_generate_length=64"):
            client.completions.create(model="tiny", prompt=long_reply, max_tokens=65)
        session = open_session(backend, engine)  # a session's turn: min(500, room 64, 8) = 8
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=500)
    assert [s.max_tokens for s in engine.samplings] == [8, 8, 5, 8]


def test_a_forked_row_and_what_follows_it_fit_max_prompt_plus_max_generate(tiny_tokenizer):
    """max_prompt_length 64, max_generate_length 32: no engine request (prompt + max_tokens)
    and no training row exceeds 64 + 32 = 96, after a fork whose prompt is over 64."""
    from skyrl.generators import Trajectory, trajectories_to_output
    from skyrl.serve.reconcile import to_turns

    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=64, max_gen=32) as (url, backend):
        session = open_session(backend, engine)
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        chat = client.chat.completions.create
        # The tiny tokenizer here: "<|im_start|>system\n" 3 tokens, user header 3, assistant
        # header 5, "<|im_end|>\n" 2, "x" * 50 50, "SAY:a" 5, "a" 1, "go go" 5, EOS 1.
        # 1. first: user SAY:hi, prompt 3 + 6 + 2 + 5 = 16, max_tokens 32 -> "hi" EOS
        chat(model="tiny", messages=[{"role": "user", "content": "SAY:hi"}])
        # 2. history rewritten: a fork, prompt 3 + 50 + 2 + 3 + 5 + 2 + 5 = 70 (over 64);
        #    max_tokens min(32 - 0, 96 - 70) = 26 -> "a" EOS, chain 72
        msgs = [{"role": "system", "content": "x" * 50}, {"role": "user", "content": "SAY:a"}]
        r = chat(model="tiny", messages=msgs)
        # 3. append: prompt 70 + "a" 1 + "<|im_end|>\n" 2 + 3 + "SAY:go go" 9 + 2 + 5 = 92;
        #    used 92 - 70 = 22;
        #    max_tokens min(32 - 22 = 10, 96 - 92 = 4) = 4 (was 10: a 98-token row)
        msgs += [r.choices[0].message.model_dump(), {"role": "user", "content": "SAY:go go"}]
        r = chat(model="tiny", messages=msgs)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
        # 4. the row is full (96): the next append is refused, naming the limit
        msgs += [r.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
        with pytest.raises(openai.BadRequestError, match="max_generate_length = 96"):
            chat(model="tiny", messages=msgs)
        # 5. a fork with a short prompt (user SAY:b: 3 + 5 + 2 + 5 = 15) gets what a first
        #    prompt gets: min(32, 96 - 15 = 81) = 32 (was 81)
        chat(model="tiny", messages=[{"role": "user", "content": "SAY:b"}])
    sent = [(len(p), s.max_tokens) for p, s in zip(engine.prompts, engine.samplings, strict=True)]
    assert sent == [(16, 32), (70, 26), (92, 4), (15, 32)]
    assert [r.decision.kind for r in session.records] == ["first", "fork", "append", "fork"]
    row = PromptRow("q", "toy", {}, uid="p7")
    traj = Trajectory(row, "p7/0", to_turns(session.records), 1.0, "stop")
    out = trajectories_to_output([traj], step_wise=False)
    out.validate()
    # row 2: prompt 70 + response "a" EOS 2 + appended 92 - 72 = 20 + sampled 4 = 96
    prompts, responses = out.prompt_token_ids, out.response_token_ids
    rows = [(len(p), len(r)) for p, r in zip(prompts, responses, strict=True)]
    assert rows == [(16, 3), (70, 26), (15, 2)]


def test_replies_stop_at_the_template_turn_end_when_eos_differs(tiny_model_path):
    """A Qwen2.5-base-like tokenizer (EOS ``<|endoftext|>``, turns end ``<|im_end|>``) and a
    model that goes on after the turn end and invents the next turns: chat requests, in a
    session or not, stop at ``<|im_end|>`` (as the built-in loop's turns do); the raw
    completions endpoint does not (its prompt need not be a chat)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)  # own copy: its EOS changes
    tok.eos_token = "<|endoftext|>"
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id != im_end
    invented = "<|im_end|>\n<|im_start|>user\ninvented<|im_end|>\n<|im_start|>assistant\nsure"
    engine = ScriptedEngine(tok, then=invented)
    with endpoint(engine, tok, max_prompt=128, max_gen=64) as (url, backend):
        row = PromptRow("q", "toy", {}, uid="p7")
        sampling = SamplingParams(seed=11, stop_token_ids=[7])
        session = backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine)))
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        messages = [{"role": "user", "content": "SAY:four"}]
        r = client.chat.completions.create(model="tiny", messages=messages)
        assert r.choices[0].message.content == "four" and r.choices[0].finish_reason == "stop"
        (record,) = session.records
        assert record.response_ids == tok.encode("four", add_special_tokens=False) + [im_end]
        # the reply sent back renders as "four<|im_end|>\n...": the chain goes on
        messages += [r.choices[0].message.model_dump(), {"role": "user", "content": "SAY:ok"}]
        client.chat.completions.create(model="tiny", messages=messages)
        assert session.records[1].decision.kind == "append"
        free = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        r = free.chat.completions.create(model="tiny", messages=messages[:1])
        assert r.choices[0].message.content == "four"
        r = free.completions.create(model="tiny", prompt="SAY:four")
        assert r.choices[0].text.startswith("four\nuser\ninvented")
    # the session's own stop ids are kept, the turn end added; none added to completions
    stops = [s.stop_token_ids for s in engine.samplings]
    assert stops == [[7, im_end], [7, im_end], [im_end], []]
    assert sampling.stop_token_ids == [7]  # the session's sampling is not changed


def test_a_session_deciding_a_long_chain_does_not_hold_up_the_others(tiny_tokenizer):
    """Session a's chain decision decodes (here: it waits, up to 5 s, until session b's
    request is answered); b's request is answered meanwhile, on the same endpoint loop."""
    import asyncio
    import threading

    from skyrl.inference.base import Completion
    from skyrl.serve.backend import Limits, OpenAIBackend
    from skyrl.serve.reconcile import Chain

    class Instant:
        async def generate(self, prompt_ids, sampling, route_key=None):
            return Completion([tiny_tokenizer.eos_token_id], [-0.5], "stop")

    backend = OpenAIBackend(tiny_tokenizer, ["tiny"], Limits(64, 32), binding=None)
    a, b = (open_session(backend, Instant()) for _ in range(2))
    b_answered = threading.Event()
    waited: list[bool] = []

    def slow_decode(ids):
        waited.append(b_answered.wait(5))
        return tiny_tokenizer.decode(ids, skip_special_tokens=False)

    a.chain = Chain(slow_decode, ids=[5, 6, 7], last_prompt_len=3)  # not a prefix: decodes
    hi = [{"role": "user", "content": "hi"}]

    async def both():
        ask_a = asyncio.create_task(backend.chat({"model": "tiny", "messages": hi}, a.key))
        await asyncio.sleep(0)  # a is deciding
        await backend.chat({"model": "tiny", "messages": hi}, b.key)
        b_answered.set()
        await ask_a

    asyncio.run(both())
    assert waited and all(waited)  # no decode of a's waited past b's answer
    assert [r.decision.kind for r in a.records] == ["fork"] and len(b.records) == 1


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
        (CHAT, {"messages": [X], "tools": [CALC], "tool_choice": "required"}, "tool_choice"),
        (CHAT, {"messages": [X], "tools": [CALC], "tool_choice": CALC}, "tool_choice"),
        (CHAT, {"messages": [X], "tool_choice": "bogus"}, "tool_choice"),
        (CHAT, {"messages": [X], "response_format": {"type": "json_object"}}, "response_format"),
        (CHAT, {"messages": [X], "response_format": "text"}, "response_format"),
        (CHAT, {"messages": [X], "logprobs": True, "top_logprobs": 3}, "top_logprobs"),
        (CHAT, {"messages": [X], "logit_bias": {"100": -100}}, "logit_bias"),
        (CHAT, {"messages": [X], "presence_penalty": 1.0}, "presence_penalty"),
        (CHAT, {"messages": [X], "frequency_penalty": 1.5}, "frequency_penalty"),
        (CHAT, {"messages": [X], "functions": [CALC["function"]]}, "functions"),
        (CHAT, {"messages": [X], "function_call": {"name": "calculator"}}, "function_call"),
        ("completions", {"prompt": "x", "logprobs": 2}, "logprobs"),
        ("completions", {"prompt": "x", "best_of": 3}, "best_of"),
        ("completions", {"prompt": "x", "suffix": " end"}, "suffix"),
        ("completions", {"prompt": "x", "logit_bias": {"100": -100}}, "logit_bias"),
        ("completions", {"prompt": "x", "frequency_penalty": -0.5}, "frequency_penalty"),
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


def test_a_reply_text_leaves_out_its_turn_end_when_eos_differs(tiny_model_path):
    """The text the tool parser reads (special tokens kept) of a reply that stopped on the
    template's turn end, on a Qwen2.5-base-like tokenizer: it carried ``<|im_end|>`` (only
    the tokenizer's EOS was left out)."""
    from transformers import AutoTokenizer

    from skyrl.serve.chat_format import ChatFormat

    tok = AutoTokenizer.from_pretrained(tiny_model_path)  # own copy: its EOS changes
    tok.eos_token = "<|endoftext|>"
    fmt = ChatFormat(tok)
    four = tok.encode("four", add_special_tokens=False)
    for end in ("<|im_end|>", "<|endoftext|>"):
        assert fmt.reply_text(four + [tok.convert_tokens_to_ids(end)], keep_special=True) == "four"
    assert fmt.reply_text(four, keep_special=True) == "four"  # cut at max_tokens
