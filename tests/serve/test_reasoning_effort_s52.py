"""``reasoning_effort`` (an OpenAI field: ``client.chat.completions.create(...,
reasoning_effort="none")``) is a 400 naming it unless null: vLLM's server renders it into the
chat template, and ``enable_thinking`` with it, so an agent asking for no thinking gets a
Qwen3 prompt without it there, while here it was ignored with a 200 and the session trained on
the prompt with thinking, as ``chat_template_kwargs={"enable_thinking": false}`` was before it
was refused. The engine is scripted (``scripted_engine``)."""

from __future__ import annotations

import httpx
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

ASK = [{"role": "user", "content": "SAY:hi"}]
NO_THINKING = (
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}"
)
"""What Qwen3's template adds after the generation prompt when thinking is off."""


@pytest.fixture(scope="module")
def thinking_template(tiny_model_path):
    """The tiny tokenizer with Qwen3's ``enable_thinking`` switch at the end of its template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)  # its own copy: the template changes
    tok.chat_template = tok.chat_template + NO_THINKING
    off = tok.apply_chat_template(
        ASK, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    on = tok.apply_chat_template(ASK, tokenize=False, add_generation_prompt=True)
    assert off == on + "<think>\n\n</think>\n\n"  # vLLM's prompt for reasoning_effort "none"
    return tok


@pytest.mark.parametrize("effort", ["none", "low", "high"])
def test_a_reasoning_effort_is_a_400_naming_it(thinking_template, effort):
    engine = ScriptedEngine(thinking_template)
    with endpoint(engine, thinking_template) as (url, _):
        body = {"model": "tiny", "messages": ASK, "reasoning_effort": effort}
        r = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "reasoning_effort"
    assert error["message"] == (
        f"reasoning_effort {effort!r} is not supported (only null: the chat template is "
        "rendered without it)"
    )
    assert engine.prompts == []  # nothing was sampled


def test_a_null_reasoning_effort_passes(thinking_template):
    engine = ScriptedEngine(thinking_template)
    with endpoint(engine, thinking_template) as (url, _):
        body = {"model": "tiny", "messages": ASK, "reasoning_effort": None}
        r = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hi"
