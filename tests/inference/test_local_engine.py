"""``LocalEngine.generate``: what a request must be before it is queued."""

import asyncio

import pytest
import torch
from transformers import AutoTokenizer

from skyrl.inference.base import SamplingParams
from skyrl.inference.hf import HFEngine
from skyrl.inference.local import run_serving
from skyrl.models import build_tiny_model


@pytest.fixture(scope="module")
def setup():
    path = build_tiny_model()
    return HFEngine(path), AutoTokenizer.from_pretrained(path).encode("Hello")


def test_prompt_ids_that_are_not_token_ids_fail_that_request_alone(setup):
    """A text given as ``prompt_ids`` became a list of characters and raised TypeError
    ('<' not supported between 'str' and 'int') out of ``serve``: every request of the
    batch failed and serving stopped. A float id was cut to an int (1.5 -> token 1) and
    sampled from without a word. Each is now a TypeError for its own request; integer
    tensors and numpy-like ints are token ids and are served."""
    engine, prompt = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=3)

    async def run():
        return await asyncio.gather(
            engine.generate("Hello", greedy),
            engine.generate([prompt[0], 1.5], greedy),
            engine.generate([prompt], greedy),
            engine.generate(torch.tensor(prompt), greedy),
            engine.generate(prompt, greedy),
            return_exceptions=True,
        )

    text, float_id, nested, tensor, fine = run_serving(engine, run())
    assert isinstance(text, TypeError)
    assert str(text) == "prompt_ids is a str; the engine takes token ids (a list of ints)"
    assert isinstance(float_id, TypeError)
    assert str(float_id) == "prompt_ids[1] is 1.5 (a float), not a token id (an int)"
    assert isinstance(nested, TypeError)
    assert str(nested) == f"prompt_ids[0] is {prompt!r} (a list), not a token id (an int)"
    assert tensor.token_ids == fine.token_ids and len(fine.token_ids) == 3


def test_sampling_that_is_not_a_sampling_params_fails_that_request_alone(setup):
    """``generator.sampling`` (a ``SamplingConfig``, no ``max_tokens``) or a dict raised
    AttributeError out of ``serve``: every request failed and serving stopped."""
    from skyrl.config.generator import SamplingConfig

    engine, prompt = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=3)

    async def run():
        return await asyncio.gather(
            engine.generate(prompt, SamplingConfig()),
            engine.generate(prompt, {"max_tokens": 3}),
            engine.generate(prompt, greedy),
            return_exceptions=True,
        )

    config, mapping, fine = run_serving(engine, run())
    assert isinstance(config, TypeError) and str(config) == (
        "sampling is a SamplingConfig; the engine takes a SamplingParams "
        "(SamplingParams.from_config builds one from generator.sampling)"
    )
    assert isinstance(mapping, TypeError) and str(mapping).startswith("sampling is a dict; ")
    assert len(fine.token_ids) == 3
