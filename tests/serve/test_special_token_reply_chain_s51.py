"""A session's reply holding a special token before its end (here ``<|im_start|>``: a model
writing a chat-template marker mid-reply, or any special token the engine does not stop on)
is answered without it, as vLLM's server answers (``skip_special_tokens``) and as the
built-in loop's env reads a reply. Sent back as the agent got it, the request continues the
row, the engine given the sampled token as sampled: the session forked the row
(``rerendered``) on every such reply, as if the agent had changed it. The engine is scripted
(``scripted_engine``): it says what the prompt's last ``SAY:`` tells it."""

from __future__ import annotations

from contextlib import contextmanager

import openai
import pytest
from conftest import endpoint, training_session
from scripted_engine import ScriptedEngine

TAIL = "<|im_end|>\n<|im_start|>user\nSAY:{}<|im_end|>\n<|im_start|>assistant\n"
"""What the template writes after a reply that ended on ``<|im_end|>`` (the tiny tokenizer's
EOS and turn end), through the agent's next message, to the next generation prompt."""
FIRST = [{"role": "user", "content": "SAY:a<|im_start|>b"}]
"""The first request: the model writes ``a<|im_start|>b``."""


@contextmanager
def scripted_session(tok, then: str = ""):
    """``(engine, session, client)``: a training session on a scripted engine's endpoint."""
    engine = ScriptedEngine(tok, then=then)
    with endpoint(engine, tok, max_prompt=256, max_gen=128) as (url, backend):
        session = training_session(backend, engine, seed=11)
        yield engine, session, openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)


def test_a_chat_reply_with_a_special_token_inside_continues_the_row(tiny_tokenizer):
    tok = tiny_tokenizer
    with scripted_session(tok) as (engine, session, client):
        messages = list(FIRST)
        for said in ("x<|im_start|>y", "z"):
            reply = client.chat.completions.create(model="tiny", messages=messages)
            messages += [
                reply.choices[0].message.model_dump(),
                {"role": "user", "content": "SAY:" + said},
            ]
        assert [m["content"] for m in messages[1::2]] == ["ab", "xy"]  # the token left out
        client.chat.completions.create(model="tiny", messages=messages)
    records = session.records
    assert [r.decision.kind for r in records] == ["first", "realigned", "realigned"]
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert im_start in records[0].response_ids and im_start in records[1].response_ids
    # each engine prompt: the one before + what was sampled for it (the special token too,
    # up to the <|im_end|> it ended on) + the template's turn end and the next message
    for k, said in ((1, "x<|im_start|>y"), (2, "z")):
        tail = tok.encode(TAIL.format(said), add_special_tokens=False)
        assert engine.prompts[k] == engine.prompts[k - 1] + records[k - 1].response_ids[:-1] + tail


@pytest.mark.parametrize("rewritten", ["aX", "a<|im_start|>b"])
def test_a_reply_changed_otherwise_still_forks(tiny_tokenizer, rewritten):
    # only the left-out token is looked past: other text is a rerendered reply; the reply
    # sent back with the token written as text renders it again and continues the row
    with scripted_session(tiny_tokenizer) as (_, session, client):
        client.chat.completions.create(model="tiny", messages=FIRST)
        messages = FIRST + [
            {"role": "assistant", "content": rewritten},
            {"role": "user", "content": "SAY:z"},
        ]
        client.chat.completions.create(model="tiny", messages=messages)
    kinds = [(r.decision.kind, r.decision.reason) for r in session.records]
    assert kinds[1] == (("fork", "rerendered") if rewritten == "aX" else ("append", ""))


def test_a_completion_with_a_special_token_inside_continues_the_row(tiny_tokenizer):
    # /v1/completions: the text given leaves the token out too; the agent's next prompt is
    # its prompt + the text it got + more
    tok = tiny_tokenizer
    sampled = len(tok.encode("a<|im_start|>b done", add_special_tokens=False))  # all but EOS
    with scripted_session(tok, then=" done") as (engine, session, client):
        prompt = "Q: SAY:a<|im_start|>b"
        first = client.completions.create(model="tiny", prompt=prompt, max_tokens=sampled)
        assert first.choices[0].text == "ab done" and first.choices[0].finish_reason == "length"
        client.completions.create(model="tiny", prompt=prompt + first.choices[0].text + " more")
    assert [r.decision.kind for r in session.records] == ["first", "realigned"]
    chain = engine.prompts[0] + session.records[0].response_ids
    assert engine.prompts[1] == chain + tok.encode(" more", add_special_tokens=False)
