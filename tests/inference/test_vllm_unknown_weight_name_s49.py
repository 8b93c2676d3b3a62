"""The vllm engine refuses an update naming a parameter its model lacks before anything
loads (vLLM's reload raised only after moving the model to the meta device: every later
request failed with "attempted to run this operator with Meta tensors")."""

import pytest
from transformers import AutoModelForCausalLM
from vllm_refusals import assert_refused_and_unchanged, other_parameters, tiny_vllm_engine

from skyrl.models import build_tiny_model

pytestmark = pytest.mark.slow


def test_an_update_with_a_misspelt_name_is_refused_and_the_engine_still_serves():
    engine = tiny_vllm_engine()
    try:
        named = other_parameters()
        named[-1] = ("model.norm.weigth", named[-1][1])  # model.norm.weight, misspelt
        assert_refused_and_unchanged(
            engine,
            named,
            r"^vllm engine: update_weights: the model has no parameter "
            r"'model\.norm\.weigth'; closest: model\.norm\.weight",
        )
    finally:
        engine.shutdown()


def test_a_tied_models_whole_state_dict_still_loads():
    """``lm_head.weight`` of a tied model is no parameter of vLLM's (it skips the name)."""
    tied = {"arch": "llama", "tie_word_embeddings": True}
    engine = tiny_vllm_engine(**tied)
    try:
        state = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1, **tied)).state_dict()
        assert "lm_head.weight" in state
        engine.update_weights(list(state.items()))
    finally:
        engine.shutdown()
