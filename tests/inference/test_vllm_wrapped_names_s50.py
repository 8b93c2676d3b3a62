"""The vllm engine refuses an update none of whose names its model has (the parameters of a
wrapped model: DeepSpeed's or DDP's ``module.``, PEFT's ``base_model.model.``) before
anything loads. Such an update passed the name check, left to vLLM, whose reload raised
only after moving the model to the meta device: every later request failed with
"_C::onednn_mm: attempted to run this operator with Meta tensors"."""

import re

import pytest
from vllm_refusals import assert_refused_and_unchanged, other_parameters, tiny_vllm_engine

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("prefix", ["module.", "base_model.model."])
def test_an_update_of_a_wrapped_models_names_is_refused_and_the_engine_still_serves(prefix):
    engine = tiny_vllm_engine()
    try:
        named = [(prefix + n, p) for n, p in other_parameters()]
        assert named[0][0] == f"{prefix}model.embed_tokens.weight"
        message = (
            f"vllm engine: update_weights: the model has no parameter "
            f"'{prefix}model.embed_tokens.weight'; closest: model.embed_tokens.weight"
        )
        assert_refused_and_unchanged(engine, named, "^" + re.escape(message))
    finally:
        engine.shutdown()
