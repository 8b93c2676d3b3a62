"""More of vLLM's request fields that no engine here honours (sent with the ``openai`` client's
``extra_body`` by agents written for vLLM's server) are a 400 naming the field unless they have
their default value, as ``VLLM_EXTENSIONS`` are since ed7b700: each was ignored with a 200 (a
banned word sampled, a prompt vLLM would cut served whole, a chat request asking for BOS on top
of the template's, documents the template never saw). The engine is scripted."""

from __future__ import annotations

import httpx
import pytest
import test_vllm_extension_fields_s51 as s51

ASK = s51.ASK
scripted = s51.scripted
"""The scripted endpoint of the first fields' tests (a fixture)."""


def _post(url: str, route: str, fields: dict) -> httpx.Response:
    sent = {"messages": ASK} if route == "chat/completions" else {"prompt": "SAY:hi"}
    return httpx.post(f"{url}/{route}", json={"model": "tiny", **sent, **fields}, timeout=60)


@pytest.mark.parametrize(
    "route, field, value, allowed",
    [
        ("completions", "bad_words", ["hi"], "[]"),
        ("chat/completions", "allowed_token_ids", [5], "null"),
        ("completions", "truncate_prompt_tokens", 3, "null"),
        ("chat/completions", "prompt_logprobs", 1, "null"),
        ("completions", "logprob_token_ids", [5], "null"),
        ("chat/completions", "return_tokens_as_token_ids", True, "false"),
        ("chat/completions", "thinking_token_budget", 10, "null"),
        ("chat/completions", "add_special_tokens", True, "false"),
        ("chat/completions", "documents", [{"title": "a", "text": "b"}], "null"),
        ("chat/completions", "echo", True, "false"),
    ],
)
def test_a_vllm_field_no_engine_honours_is_a_400_naming_it(scripted, route, field, value, allowed):
    engine, url = scripted
    asked = len(engine.prompts)
    r = _post(url, route, {field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(f"{field} {value!r} is not supported (only {allowed}:")
    assert len(engine.prompts) == asked  # nothing was sampled


def test_their_defaults_pass(scripted):
    _, url = scripted
    unset = (
        "allowed_token_ids",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "thinking_token_budget",
    )
    defaults = {**dict.fromkeys(unset), "bad_words": [], "return_tokens_as_token_ids": False}
    chat = {"add_special_tokens": False, "documents": None, "echo": False}
    r = _post(url, "chat/completions", {**defaults, **chat})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi", r.text
    r = _post(url, "completions", defaults)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hi", r.text
