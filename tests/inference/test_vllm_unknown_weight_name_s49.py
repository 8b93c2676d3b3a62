"""The vllm engine refuses an update naming a parameter its model lacks before anything
loads (vLLM's reload raised only after moving the model to the meta device: every later
request failed with "attempted to run this operator with Meta tensors")."""

import pytest
from transformers import AutoModelForCausalLM

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import generate_batch
from skyrl.models import build_tiny_model

pytestmark = pytest.mark.slow


def test_an_update_with_a_misspelt_name_is_refused_and_the_engine_still_serves():
    from skyrl.inference.vllm_engine import VLLMEngine

    path = build_tiny_model()
    engine = VLLMEngine(path, kv_cache_memory_bytes=16 << 20, max_model_len=512)
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=4)
        [[before]] = generate_batch(engine, [[1, 2, 3, 4]], greedy)
        other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
        named = [(n, p.detach()) for n, p in other.named_parameters()]
        named[-1] = ("model.norm.weigth", named[-1][1])  # model.norm.weight, misspelt
        with pytest.raises(
            ValueError,
            match=r"^vllm engine: update_weights: the model has no parameter "
            r"'model\.norm\.weigth'; closest: model\.norm\.weight",
        ):
            engine.update_weights(named)
        [[after]] = generate_batch(engine, [[1, 2, 3, 4]], greedy)
        assert after.token_ids == before.token_ids
        assert after.logprobs == before.logprobs  # nothing of the refused update loaded
    finally:
        engine.shutdown()


def test_a_tied_models_whole_state_dict_still_loads():
    """``lm_head.weight`` of a tied model is no parameter of vLLM's (it skips the name)."""
    from skyrl.inference.vllm_engine import VLLMEngine

    tied = {"arch": "llama", "tie_word_embeddings": True}
    engine = VLLMEngine(build_tiny_model(**tied), kv_cache_memory_bytes=16 << 20, max_model_len=512)
    try:
        state = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1, **tied)).state_dict()
        assert "lm_head.weight" in state
        engine.update_weights(list(state.items()))
    finally:
        engine.shutdown()
