"""The vllm engine refuses an update with a tensor of another shape than the model's before
anything loads (vLLM's reload failed with an AssertionError after moving the model to the
meta device: every later request failed with "Tensor on device cpu is not on the expected
device meta!")."""

import pytest
from vllm_refusals import (
    GREEDY,
    assert_refused_and_unchanged,
    other_parameters,
    tiny_vllm_engine,
)

from skyrl.inference.local import generate_batch

pytestmark = pytest.mark.slow


def test_a_mis_shaped_tensor_is_refused_and_the_engine_still_serves():
    engine = tiny_vllm_engine()
    try:
        [[before]] = generate_batch(engine, [[1, 2, 3, 4]], GREEDY)
        right = other_parameters()
        names = [n for n, _ in right]
        norm = names.index("model.norm.weight")
        width = right[norm][1].shape[0]
        named = list(right)
        named[norm] = ("model.norm.weight", right[norm][1][:-1].clone())  # one short
        assert_refused_and_unchanged(
            engine,
            named,
            rf"^vllm engine: update_weights: 'model\.norm\.weight' is a tensor of shape "
            rf"\[{width - 1}\]; the model's is \[{width}\] \(nothing was loaded\)$",
        )
        # a fused layer's part (q_proj, in vLLM's qkv_proj) of the wrong shape too
        q = next(i for i, n in enumerate(names) if n.endswith("q_proj.weight"))
        named = list(right)
        named[q] = (names[q], right[q][1][:, :-1].clone())
        assert_refused_and_unchanged(engine, named, r"q_proj\.weight' is a tensor of shape")
        engine.update_weights(right)  # the right shapes load
        [[updated]] = generate_batch(engine, [[1, 2, 3, 4]], GREEDY)
        assert updated.logprobs != before.logprobs
    finally:
        engine.shutdown()
