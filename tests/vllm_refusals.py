"""Test helper for the vllm engine's refused-update tests (tests/ is on sys.path): an engine
on the tiny model, another tiny model's parameters to send, and the check that a refused
update loads nothing."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import generate_batch
from skyrl.models import build_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def tiny_vllm_engine(**model):
    """A vllm engine on the tiny model (``build_tiny_model(**model)``)."""
    from skyrl.inference.vllm_engine import VLLMEngine

    return VLLMEngine(build_tiny_model(**model), kv_cache_memory_bytes=16 << 20, max_model_len=512)


def other_parameters(**model) -> list[tuple[str, torch.Tensor]]:
    """The named parameters of the tiny model built with another seed."""
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1, **model))
    return [(n, p.detach()) for n, p in other.named_parameters()]


def assert_refused_and_unchanged(engine, named: list, match: str) -> None:
    """``engine.update_weights(named)`` raises a ``ValueError`` matching ``match``, and the
    engine then serves exactly as before: nothing of the refused update loaded."""
    [[before]] = generate_batch(engine, [[1, 2, 3, 4]], GREEDY)
    with pytest.raises(ValueError, match=match):
        engine.update_weights(named)
    [[after]] = generate_batch(engine, [[1, 2, 3, 4]], GREEDY)
    assert after.token_ids == before.token_ids
    assert after.logprobs == before.logprobs
