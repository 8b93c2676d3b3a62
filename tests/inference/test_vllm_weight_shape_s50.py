"""The vllm engine refuses an update with a tensor of another shape than the model's before
anything loads (vLLM's reload failed with an AssertionError after moving the model to the
meta device: every later request failed with "Tensor on device cpu is not on the expected
device meta!")."""

import pytest
from transformers import AutoModelForCausalLM

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import generate_batch
from skyrl.models import build_tiny_model

pytestmark = pytest.mark.slow


def test_a_mis_shaped_tensor_is_refused_and_the_engine_still_serves():
    from skyrl.inference.vllm_engine import VLLMEngine

    engine = VLLMEngine(build_tiny_model(), kv_cache_memory_bytes=16 << 20, max_model_len=512)
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=4)
        [[before]] = generate_batch(engine, [[1, 2, 3, 4]], greedy)
        other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
        named = [(n, p.detach()) for n, p in other.named_parameters()]
        norm = next(i for i, (n, _) in enumerate(named) if n == "model.norm.weight")
        width = named[norm][1].shape[0]
        named[norm] = ("model.norm.weight", named[norm][1][:-1].clone())  # one short
        with pytest.raises(
            ValueError,
            match=rf"^vllm engine: update_weights: 'model\.norm\.weight' is a tensor of shape "
            rf"\[{width - 1}\]; the model's is \[{width}\] \(nothing was loaded\)$",
        ):
            engine.update_weights(named)
        [[after]] = generate_batch(engine, [[1, 2, 3, 4]], greedy)
        assert after.token_ids == before.token_ids
        assert after.logprobs == before.logprobs  # nothing of the refused update loaded
        # a fused layer's part (q_proj, in vLLM's qkv_proj) of the wrong shape too
        q = next(i for i, (n, _) in enumerate(named) if n.endswith("q_proj.weight"))
        named[norm] = ("model.norm.weight", other.model.norm.weight.detach())
        named[q] = (named[q][0], named[q][1][:, :-1].clone())
        with pytest.raises(ValueError, match=r"q_proj\.weight' is a tensor of shape"):
            engine.update_weights(named)
        named[q] = (named[q][0], other.get_parameter(named[q][0]).detach())
        engine.update_weights(named)  # the right shapes load
        [[updated]] = generate_batch(engine, [[1, 2, 3, 4]], greedy)
        assert updated.logprobs != before.logprobs
    finally:
        engine.shutdown()
