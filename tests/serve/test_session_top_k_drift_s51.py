"""A training session's request asking for another ``top_k`` or ``min_p`` than the training
sampling drifts as a temperature or top_p does: refused (400) or, with
``generator.agent_sampling_drift=override``, counted, and sampled with the training values
either way. Before, a session's ``top_k: 20`` passed with a 200 and was counted nowhere
(``sampling_overrides`` 0) while the row trained as if sampled with top_k -1."""

from __future__ import annotations

import httpx
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session

ASK = [{"role": "user", "content": "SAY:hi"}]


@pytest.fixture
def scripted(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer) as (url, backend):
        yield engine, url, backend


def _session(backend, engine, drift: str) -> Session:
    row = PromptRow("q", "toy", {}, uid="p7")
    sampling = SamplingParams(temperature=1.0, top_k=-1, min_p=0.0, seed=11)
    return backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine), drift=drift))


def _post(url: str, key: str, **fields) -> httpx.Response:
    body = {"model": "tiny", "messages": ASK, **fields}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("field, value, used", [("top_k", 20, -1), ("min_p", 0.05, 0.0)])
def test_a_drifting_top_k_or_min_p_is_refused(scripted, field, value, used):
    engine, url, backend = scripted
    strict = _session(backend, engine, "error")
    response = _post(url, strict.key, **{field: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(
        f"{field} {value} differs from the training {field} {used} (generator.sampling.{field})"
    )
    assert _post(url, strict.key, **{field: used}).status_code == 200  # the same: fine
    assert len(strict.records) == 1 and strict.sampling_overrides == 0


def test_an_overridden_top_k_and_min_p_are_counted_and_not_used(scripted):
    engine, url, backend = scripted
    loose = _session(backend, engine, "override")
    assert _post(url, loose.key, top_k=20, min_p=0.05).status_code == 200
    assert loose.sampling_overrides == 2  # top_k and min_p, both set back
    assert (engine.samplings[-1].top_k, engine.samplings[-1].min_p) == (-1, 0.0)
