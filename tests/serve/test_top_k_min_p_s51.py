"""``skyrl-serve`` (requests without a session) samples with the request's ``top_k`` and
``min_p``, vLLM's extensions that its server reads (``extra_body`` in the ``openai`` client;
Qwen's recommended settings include ``top_k=20``): the endpoint ignored both and sampled
with top_k -1 and min_p 0 whatever the request said, and a value no engine takes passed
(now a 400 naming it). The engine is scripted (``scripted_engine``): it records the sampling
each request reached it with."""

from __future__ import annotations

import httpx
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

ASK = [{"role": "user", "content": "SAY:hi"}]


@pytest.fixture
def scripted(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer) as (url, _):
        yield engine, url


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_top_k_and_min_p_reach_the_engine(scripted, route):
    engine, url = scripted
    asked = {"messages": ASK} if route == "chat/completions" else {"prompt": "SAY:hi"}
    body = {"model": "tiny", "top_k": 20, "min_p": 0.05, **asked}
    assert httpx.post(f"{url}/{route}", json=body, timeout=60).status_code == 200
    assert (engine.samplings[-1].top_k, engine.samplings[-1].min_p) == (20, 0.05)
    body = {"model": "tiny", **asked}  # absent: the engines' defaults (all tokens)
    assert httpx.post(f"{url}/{route}", json=body, timeout=60).status_code == 200
    assert (engine.samplings[-1].top_k, engine.samplings[-1].min_p) == (-1, 0.0)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("top_k", 0, "top_k must be -1 or >= 1, got 0"),
        ("top_k", 2.5, "top_k must be an integer, got 2.5"),
        ("top_k", "20", "top_k must be a number, got '20'"),
        ("min_p", 1.5, "min_p must be in [0, 1], got 1.5"),
    ],
)
def test_a_value_no_engine_takes_is_a_400_naming_it(scripted, field, value, message):
    engine, url = scripted
    body = {"model": "tiny", "messages": ASK, field: value}
    response = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == message
    assert response.json()["error"]["param"] == field
    assert engine.samplings == []  # nothing was sampled
