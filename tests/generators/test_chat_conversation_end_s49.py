"""A template that closes a whole conversation with EOS (Phi-3, Phi-3.5, Phi-4-mini:
``{% if add_generation_prompt %}<|assistant|>\\n{% else %}{{ eos_token }}{% endif %}``).

Its turns end ``<|end|>\\n``; the EOS after the last message only ends a conversation with no
generation prompt. It was read as part of the turn end (``<|end|>\\n<|endoftext|>``, stopped
on EOS, so ``<|end|>`` was no stop id), and every multi-turn observation was refused as
NotAppendOnly ("re-renders earlier turns ... use max_turns=1"), though it only appends."""

import pytest

from skyrl.generators.chat import ChatTokens
from skyrl.models.tiny import build_tiny_tokenizer

PHI35_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
"""Phi-3.5-mini-instruct's chat template, as its tokenizer_config.json ships it."""


@pytest.fixture(scope="module")
def phi():
    tok = build_tiny_tokenizer()
    tok.add_special_tokens(
        {
            "additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
            "eos_token": "<|endoftext|>",
        }
    )
    tok.chat_template = PHI35_TEMPLATE
    return tok


def test_the_turn_end_is_end_and_newline(phi):
    chat = ChatTokens(phi)
    end = phi.convert_tokens_to_ids("<|end|>")
    assert chat.conversation_end == "<|endoftext|>"
    assert (chat.turn_end, chat.turn_end_id, chat.assistant_tail) == ("<|end|>\n", end, "\n")
    assert chat.turn_stop_ids == [end]  # EOS is <|endoftext|>: <|end|> must stop a reply too


def test_two_turns_extend_to_the_templates_rendering(phi):
    chat = ChatTokens(phi)
    end = phi.convert_tokens_to_ids("<|end|>")
    messages = [{"role": "user", "content": "What is 2+2?"}]
    context = chat.prompt_ids(messages)
    for t in range(2):
        reply = phi.encode(f"answer {t}", add_special_tokens=False) + [end]
        assert chat.ends_turn(reply)
        obs = [{"role": "user", "content": f"result {t}"}]
        context = context + reply + chat.observation_ids(obs, chat.ends_turn(reply))
        messages += [{"role": "assistant", "content": f"answer {t}"}, *obs]
    assert phi.decode(context) == (
        "<|user|>\nWhat is 2+2?<|end|>\n"
        "<|assistant|>\nanswer 0<|end|>\n<|user|>\nresult 0<|end|>\n"
        "<|assistant|>\nanswer 1<|end|>\n<|user|>\nresult 1<|end|>\n<|assistant|>\n"
    )
    rendered = phi.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert phi.decode(context) == rendered


def test_a_template_ending_assistant_turns_with_eos_keeps_it():
    """Mistral / Llama 2: EOS closes every assistant turn, generation prompt or not."""
    tok = build_tiny_tokenizer()
    tok.eos_token = "<|endoftext|>"
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}"
        "{{ m['content'] + eos_token }}{% else %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
        "{% endif %}{% endfor %}"
    )
    chat = ChatTokens(tok)
    assert chat.conversation_end == ""
    assert (chat.turn_end, chat.turn_end_id) == ("<|endoftext|>", tok.eos_token_id)


def test_a_template_refusing_a_generation_prompt_after_a_reply_still_loads():
    """The conversation end is read from a render with a generation prompt after the probe's
    reply; a template that raises there is taken as having none (its turn end is EOS)."""
    tok = build_tiny_tokenizer()
    tok.eos_token = "<|endoftext|>"
    tok.chat_template = (
        "{% if add_generation_prompt and messages[-1]['role'] == 'assistant' %}"
        "{{ raise_exception('no generation prompt after an assistant message') }}{% endif %}"
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}"
    )
    chat = ChatTokens(tok)
    assert chat.conversation_end == ""
    assert (chat.turn_end, chat.turn_end_id) == ("<|endoftext|>", tok.eos_token_id)
