"""The vllm engine after ``shutdown``: each call says so in one line, as the hf engine does
(it was ``AttributeError: 'VLLMEngine' object has no attribute 'llm'``)."""

import pytest
import torch

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import generate_batch
from skyrl.models import build_tiny_model

pytestmark = pytest.mark.slow


def test_calls_after_shutdown_name_the_call():
    from skyrl.inference.vllm_engine import VLLMEngine

    engine = VLLMEngine(build_tiny_model(), kv_cache_memory_bytes=16 << 20, max_model_len=512)
    engine.shutdown()
    with pytest.raises(RuntimeError, match=r"^vllm engine: generate after shutdown\(\)$"):
        generate_batch(engine, [[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4))
    weights = [("model.norm.weight", torch.ones(1))]
    with pytest.raises(RuntimeError, match=r"^vllm engine: update_weights after shutdown\(\)$"):
        engine.update_weights(weights)
    with pytest.raises(RuntimeError, match=r"^vllm engine: receive_weights after shutdown\(\)$"):
        engine.receive_weights([])
    with pytest.raises(RuntimeError, match=r"^vllm engine: reset_prefix_cache after shutdown\(\)$"):
        engine.reset_prefix_cache()
    with pytest.raises(RuntimeError, match=r"^vllm engine: join_weight_sync after shutdown\(\)$"):
        engine.join_weight_sync("127.0.0.1", 1, 0, 1, "gloo")
