"""Logprobs' token bytes and request-field rules the OpenAI API enforces: a token that holds
part of a multi-byte character has its raw bytes (not U+FFFD's), ``tool_choice`` needs
``tools``, ``stream_options`` needs ``stream`` and a true-or-false ``include_usage``, and a
message needs content (an assistant's may have tool calls instead).
The engine is scripted (``scripted_engine``) so replies are known."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

TEXT = "café 🙂"
"""A reply whose 'é' (C3 A9) and emoji (F0 9F 99 82) the tiny byte-level BPE splits into one
token per byte: ``c a f Ã © Ġ ð Ł Ļ Ĥ`` (its vocabulary has no merge for them)."""


@pytest.fixture
def scripted(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=512, max_gen=64) as (url, backend):
        yield engine, url, backend


def post(url: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{url}/{route}", content=json.dumps({"model": "tiny", **body}),
        headers={"content-type": "application/json"}, timeout=60,
    )  # fmt: skip


def test_chat_logprobs_bytes_are_the_tokens_raw_bytes(scripted):
    engine, url, _ = scripted
    ids = engine.tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(ids) == 10  # one token per byte of 'é' and of the emoji (see TEXT)
    r = post(
        url,
        "chat/completions",
        {"messages": [{"role": "user", "content": "SAY:" + TEXT}], "logprobs": True},
    )
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == TEXT, r.text
    content = choice["logprobs"]["content"]
    assert len(content) == 11  # 10 tokens + EOS
    # the bytes of all tokens, joined, are the reply's UTF-8 (was: EF BF BD per partial token)
    joined = b"".join(bytes(t["bytes"]) for t in content if t["bytes"] is not None)
    assert joined == TEXT.encode()
    e1, e2 = content[3], content[4]  # 'é' = C3 A9
    assert (e1["bytes"], e2["bytes"]) == ([0xC3], [0xA9])
    assert (e1["token"], e2["token"]) == ("\\xc3", "\\xa9")  # not valid UTF-8 alone: escaped
    assert [t["token"] for t in content[:3]] == ["c", "a", "f"]
    assert (content[5]["token"], content[5]["bytes"]) == (" ", [0x20])
    # the EOS the reply stopped on is not its text: no bytes (OpenAI's null)
    assert (content[-1]["token"], content[-1]["bytes"]) == ("<|im_end|>", None)


def test_completions_logprobs_tokens_and_text_offsets_follow_the_bytes(scripted):
    _, url, _ = scripted
    r = post(url, "completions", {"prompt": "SAY:" + TEXT, "logprobs": 0})
    choice = r.json()["choices"][0]
    assert choice["text"] == TEXT, r.text
    logprobs = choice["logprobs"]
    assert logprobs["tokens"][3:5] == ["\\xc3", "\\xa9"]
    # characters of TEXT before each token: c0 a1 f2, both bytes of 'é' at 3, ' ' at 4, the
    # emoji's four bytes at 5, EOS at len(TEXT) = 6 (was 0..10: one U+FFFD per partial token)
    assert logprobs["text_offset"] == [0, 1, 2, 3, 3, 4, 5, 5, 5, 5, 6]


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
@pytest.mark.parametrize("tools", [None, []])
def test_tool_choice_without_tools_is_refused(scripted, choice, tools):
    _, url, _ = scripted
    say = [{"role": "user", "content": "SAY:hi"}]
    r = post(url, "chat/completions", {"messages": say, "tool_choice": choice, "tools": tools})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["message"]) == (
        "tool_choice",
        "tool_choice is only allowed when tools are specified",
    )


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"stream_options": {"include_usage": True}},
            "stream_options",
            "stream_options is only allowed when stream is true",
        ),
        (
            {"stream": False, "stream_options": {"include_usage": False}},
            "stream_options",
            "stream_options is only allowed when stream is true",
        ),
        (
            {"stream": True, "stream_options": "usage"},
            "stream_options",
            "stream_options must be an object, got 'usage'",
        ),
        (
            {"stream": True, "stream_options": {"include_usage": "false"}},
            "stream_options.include_usage",
            "stream_options.include_usage must be true or false, got 'false'",
        ),
    ],
)
def test_bad_stream_options_are_refused_by_name(scripted, route, fields, param, message):
    _, url, _ = scripted
    prompt = {"messages": [{"role": "user", "content": "SAY:hi"}]}
    if route == "completions":
        prompt = {"prompt": "SAY:hi"}
    r = post(url, route, {**prompt, **fields})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["message"]) == (param, message)


def test_null_stream_options_pass_without_stream(scripted):
    _, url, _ = scripted
    say = [{"role": "user", "content": "SAY:hi"}]
    r = post(url, "chat/completions", {"messages": say, "stream": False, "stream_options": None})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi", r.text


def test_a_sentencepiece_byte_fallback_token_is_its_byte():
    """A Llama-2-style tokenizer (U+2581 for a space, ``<0xNN>`` for a byte it has no piece
    for): 'é' is ``<0xC3> <0xA9>``, each token that one byte (its lone decode is U+FFFD)."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    from skyrl.serve.chat_format import ChatFormat

    vocab = {"<unk>": 0, "</s>": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    for piece in ["▁", "c", "a", "f", "▁c", "▁ca", "▁caf"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "c"), ("▁c", "a"), ("▁ca", "f")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    ids = fast.encode("café", add_special_tokens=False)
    assert fast.convert_ids_to_tokens(ids) == ["▁caf", "<0xC3>", "<0xA9>"]
    chat = ChatFormat(fast)
    assert [chat.token_bytes(t) for t in ids] == [b" caf", b"\xc3", b"\xa9"]
    assert chat.token_bytes(fast.eos_token_id) is None  # a special token is not text


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ({"role": "user"}, "a user message needs content"),
        ({"role": "system", "content": None}, "a system message needs content"),
        ({"role": "assistant"}, "an assistant message needs content or tool_calls"),
        (
            {"role": "assistant", "tool_calls": []},
            "an assistant message needs content or tool_calls",
        ),
    ],
)
def test_a_message_without_content_is_refused_by_name(scripted, message, said):
    # OpenAI refuses it ("content" is required unless an assistant message has tool_calls);
    # it was rendered as an empty message, the prompt not the one the agent meant
    engine, url, _ = scripted
    r = post(
        url, "chat/completions", {"messages": [message, {"role": "user", "content": "SAY:hi"}]}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["message"]) == (
        "messages[0].content",
        f"messages[0].content: {said}",
    )
    assert engine.prompts == []
