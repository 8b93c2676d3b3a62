"""vLLM's request fields beyond OpenAI's that no engine here honours (sent with the ``openai``
client's ``extra_body``, as agents written for vLLM send them) are a 400 naming the field
unless they have their default value, as the OpenAI fields the endpoint cannot honour are:
each was ignored with a 200, so ``chat_template_kwargs={"enable_thinking": false}`` left
the prompt as it was and ``repetition_penalty`` sampled without a penalty, with nothing to
say so. The engine is scripted (``scripted_engine``)."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

ASK = [{"role": "user", "content": "SAY:hi"}]


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer) as (url, _):
        yield engine, url


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("chat_template_kwargs", {"enable_thinking": False}, "null"),
        ("chat_template", "{{ messages }}", "null"),
        ("continue_final_message", True, "false"),
        ("add_generation_prompt", False, "true"),
        ("repetition_penalty", 1.3, "1"),
        ("min_tokens", 10, "0"),
        ("ignore_eos", True, "false"),
        ("stop_token_ids", [5], "[]"),
        ("skip_special_tokens", False, "true"),
        ("include_stop_str_in_output", True, "false"),
        ("use_beam_search", True, "false"),
        ("guided_json", {"type": "object"}, "null"),
        ("structured_outputs", {"regex": "a+"}, "null"),
    ],
)
def test_a_vllm_field_the_engines_cannot_honour_is_a_400_naming_it(scripted, field, value, allowed):
    engine, url = scripted
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    asked = len(engine.prompts)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=ASK, extra_body={field: value})
    error = caught.value.body
    assert error["param"] == field
    assert error["message"].startswith(f"{field} {value!r} is not supported (only {allowed}")
    assert len(engine.prompts) == asked  # nothing was sampled


def test_chat_fields_are_not_read_from_completions_and_defaults_pass(scripted):
    engine, url = scripted
    defaults = {
        "repetition_penalty": 1.0,
        "min_tokens": 0,
        "ignore_eos": False,
        "stop_token_ids": [],
        "skip_special_tokens": True,
        "include_stop_str_in_output": False,
        "use_beam_search": False,
        "guided_json": None,
    }
    chat = {"continue_final_message": False, "add_generation_prompt": True}
    body = {"model": "tiny", "messages": ASK, **defaults, **chat, "chat_template_kwargs": {}}
    assert httpx.post(f"{url}/chat/completions", json=body, timeout=60).status_code == 200
    body = {"model": "tiny", "prompt": "SAY:hi", **defaults}
    assert httpx.post(f"{url}/completions", json=body, timeout=60).status_code == 200
    body = {"model": "tiny", "prompt": "SAY:hi", "repetition_penalty": 1.2}
    response = httpx.post(f"{url}/completions", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "repetition_penalty"
