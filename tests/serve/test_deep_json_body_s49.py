"""A request body nested deeper than Python's JSON parser goes (its recursion limit) is a
400 saying so, as a body that is not JSON is; it was a 500 ``server_error`` with a
``RecursionError`` traceback in the server's log. The engine is scripted
(``scripted_engine``)."""

from __future__ import annotations

import httpx
from conftest import endpoint
from scripted_engine import ScriptedEngine


def test_a_body_nested_too_deeply_is_a_400(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    deep = b'{"model": "tiny", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with endpoint(engine, tiny_tokenizer) as (url, _):
        r = httpx.post(f"{url}/chat/completions", content=deep, timeout=60)
        ok = httpx.post(
            f"{url}/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "SAY:hi"}]},
            timeout=60,
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": "the request body is nested too deeply to read",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert engine.prompts == [engine.prompts[0]]  # only the good request reached it
    assert ok.json()["choices"][0]["message"]["content"] == "hi"
