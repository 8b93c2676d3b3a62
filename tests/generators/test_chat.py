"""ChatTokens: the multi-turn context the loop builds is the chat template's rendering, token
for token, whatever the tokenizer's EOS is and whatever day it is."""

import copy
import datetime

import pytest
import transformers.utils.chat_template_utils as chat_template_utils

from skyrl.generators.chat import ChatTokens
from skyrl.models.tiny import CHAT_TEMPLATE, build_tiny_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def chatml():
    """The tiny ChatML tokenizer: EOS is ``<|im_end|>``, the template's turn end."""
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def base_chatml():
    """As Qwen2.5 base / Math: EOS ``<|endoftext|>``, turns still end with ``<|im_end|>\\n``."""
    tok = build_tiny_tokenizer()
    tok.eos_token = "<|endoftext|>"
    return tok


def template_text(tok, messages, tools=None) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def template_ids(tok, messages, tools=None) -> list[int]:
    return tok.encode(template_text(tok, messages, tools), add_special_tokens=False)


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain", "tools"])
@pytest.mark.parametrize("ending", ["im_end", "cut"])
@pytest.mark.parametrize("tok_name", ["chatml", "base_chatml"])
def test_context_is_the_template_rendering(tok_name, ending, tools, request):
    """Two assistant turns, each ending on ``<|im_end|>`` (the engine's stop token) or cut
    off before it: after each, the loop's context equals ``apply_chat_template`` of the
    conversation so far, with the sampled reply tokens kept."""
    tok = request.getfixturevalue(tok_name)
    chat = ChatTokens(tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    messages = [{"role": "user", "content": "What is 2+2?"}]
    context = chat.prompt_ids(messages, tools)
    assert context == template_ids(tok, messages, tools)
    for t in range(2):
        reply = tok.encode(f"answer {t}", add_special_tokens=False)
        reply += [im_end] if ending == "im_end" else []
        assert chat.ends_turn(reply) == (ending == "im_end")
        obs = [{"role": "tool", "content": f"result {t}"}]
        appended = chat.observation_ids(obs, chat.ends_turn(reply), tools)
        context = context + reply + appended
        messages += [{"role": "assistant", "content": f"answer {t}"}, *obs]
        assert tok.decode(context) == template_text(tok, messages, tools)
        assert context == template_ids(tok, messages, tools)


def test_turn_end_comes_from_the_template(chatml, base_chatml):
    for tok in (chatml, base_chatml):
        chat = ChatTokens(tok)
        assert chat.turn_end == "<|im_end|>\n" and chat.assistant_tail == "\n"
        assert chat.turn_end_id == tok.convert_tokens_to_ids("<|im_end|>")


def test_reply_ended_on_a_non_template_eos(base_chatml):
    """A base model may stop on its EOS ``<|endoftext|>`` instead of ``<|im_end|>``: the reply
    is kept as sampled (its EOS was sampled and is trained) but did not close the turn, so
    the whole turn end ``<|im_end|>\\n`` follows it, as the template renders every turn."""
    tok, chat = base_chatml, ChatTokens(base_chatml)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    reply = tok.encode("ok", add_special_tokens=False) + [tok.eos_token_id]
    assert not chat.ends_turn(reply) and not chat.ends_turn([])
    assert chat.ends_turn(reply[:-1] + [im_end])
    appended = chat.observation_ids([{"role": "user", "content": "sure?"}], chat.ends_turn(reply))
    assert tok.decode(reply + appended) == (
        "ok<|endoftext|><|im_end|>\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_plain_text_turn_end_is_always_appended():
    """A template closing turns with plain text ("\\n\\n"), not a special token: a reply that
    happens to end in newlines did not end the turn, so the whole turn end follows it."""
    tok = build_tiny_tokenizer()
    tok.chat_template = (
        "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] + '\\n\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
    )
    chat = ChatTokens(tok)
    assert (chat.turn_end, chat.turn_end_id, chat.assistant_tail) == ("\n\n", None, "\n\n")
    messages = [{"role": "user", "content": "hi"}]
    context = chat.prompt_ids(messages)
    for reply_text in ("ok", "ok\n\n"):
        reply = tok.encode(reply_text, add_special_tokens=False)
        assert not chat.ends_turn(reply)
        obs = [{"role": "user", "content": "more"}]
        context = context + reply + chat.observation_ids(obs, chat.ends_turn(reply))
        messages += [{"role": "assistant", "content": reply_text}, *obs]
        assert tok.decode(context) == template_text(tok, messages)


class FakeClock:
    """``datetime`` as seen by the template's ``strftime_now``: 23:59 on ``day`` Jan 2025."""

    day = 1

    @classmethod
    def now(cls):
        return datetime.datetime(2025, 1, cls.day, 23, 59)


def test_a_dated_template_survives_midnight(monkeypatch):
    """Llama 3.x templates render today's date (``strftime_now``): a run that started
    yesterday still extends its conversations today."""
    monkeypatch.setattr(chat_template_utils, "datetime", FakeClock)
    monkeypatch.setattr(FakeClock, "day", 1)
    tok = build_tiny_tokenizer()
    tok.chat_template = (
        "{{- '<|im_start|>system\\nToday Date: ' + strftime_now('%d %b %Y') + '<|im_end|>\\n' }}"
        + CHAT_TEMPLATE
    )
    chat = ChatTokens(tok)  # built on 01 Jan
    obs = [{"role": "user", "content": "hi"}]
    assert "01 Jan 2025" in tok.decode(chat.prompt_ids(obs))
    FakeClock.day = 2  # the run goes on past midnight
    appended = chat.observation_ids(obs, True)
    assert tok.decode(appended) == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("tok_name", ["chatml", "base_chatml"])
def test_reply_text_keeps_special_tokens_for_a_tool_parser_but_not_the_stop(tok_name, request):
    """A model whose ``<tool_call>`` is a special token: ``decode`` (special tokens skipped)
    lost the markers, so no call was parsed. ``keep_special`` keeps them and drops only the
    token the reply stopped on (EOS, or ``<|im_end|>`` where that is not EOS); without it
    the text is ``decode``'s, as before."""
    tok = _with_special_tool_tokens(request.getfixturevalue(tok_name))
    chat = ChatTokens(tok)
    call = '<tool_call>\n{"name": "calc"}\n</tool_call>'
    body = tok.encode(call, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("<tool_call>") in body  # one special token
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for stop in {tok.eos_token_id, im_end}:
        assert chat.reply_text(body + [stop], True, stopped=True) == call
        assert chat.reply_text(body + [stop], False, stopped=True) == chat.decode(body + [stop])
        assert chat.decode(body + [stop]) == '\n{"name": "calc"}\n'  # the markers skipped
    # a special token that is not the last one stays: only the stop is dropped
    ends_twice = body + [im_end, im_end]
    assert chat.reply_text(ends_twice, True, stopped=True) == call + "<|im_end|>"
    assert chat.reply_text(body, True, stopped=False) == call  # cut off: nothing to drop


def _with_special_tool_tokens(tok):
    tok = copy.deepcopy(tok)
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    return tok


@pytest.mark.parametrize("tok_name", ["chatml", "base_chatml"])
def test_reply_text_drops_any_special_token_a_stopped_reply_ends_on(tok_name, request):
    """The engine also stops on the model's generation-config EOS ids and on
    ``stop_token_ids`` (Llama 3.1's ``<|eom_id|>``): the env must not see that token (a
    trailing ``<|eom_id|>`` made ``#### 42`` grade 0), unless it is a configured stop string,
    which stays in the text. A reply cut by length keeps its last token."""
    tok = copy.deepcopy(request.getfixturevalue(tok_name))
    tok.add_special_tokens({"additional_special_tokens": ["<|eom_id|>"]})
    chat = ChatTokens(tok)
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    body = tok.encode("so 6*7 is\n#### 42", add_special_tokens=False)
    assert chat.reply_text(body + [eom], True, stopped=True) == "so 6*7 is\n#### 42"
    kept = chat.reply_text(body + [eom], keep_special=True, stopped=False)
    assert kept == "so 6*7 is\n#### 42<|eom_id|>"
    as_stop_string = chat.reply_text(body + [eom], True, stopped=True, stop_strings=["<|eom_id|>"])
    assert as_stop_string == "so 6*7 is\n#### 42<|eom_id|>"
