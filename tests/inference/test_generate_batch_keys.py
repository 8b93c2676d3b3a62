"""``generate_batch``: route keys that do not pair with the prompts are one ``ValueError``
naming both counts, raised before any request is made. Before, too few keys raised a bare
``IndexError: list index out of range`` out of the event loop, after a logged
"_GatheringFuture exception was never retrieved" traceback; too many were ignored."""

import logging

import pytest

from skyrl.inference.base import SamplingParams
from skyrl.inference.hf import HFEngine
from skyrl.inference.local import generate_batch
from skyrl.models import build_tiny_model


@pytest.mark.parametrize(("keys", "count"), [(["a"], 1), (["a", "b", "c"], 3)])
def test_route_keys_not_one_per_prompt_are_refused(keys, count, caplog):
    engine = HFEngine(build_tiny_model())
    caplog.set_level(logging.ERROR, logger="asyncio")
    with pytest.raises(ValueError) as error:
        generate_batch(engine, [[1, 2], [3, 4]], SamplingParams(max_tokens=2), route_keys=keys)
    assert str(error.value) == (
        f"generate_batch: {count} route_keys for 2 prompts (one per prompt)"
    )
    assert caplog.records == []
