"""The hf engine's weight updates refuse a tensor it cannot take in one line naming it (a
bare ``KeyError`` before, printed as its repr), before loading anything; a broadcast plan it
cannot take is refused after receiving every bucket, so the sender does not wait in gloo."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from sync_sender import finish, start_sender

from skyrl.config.root import LoraConfig
from skyrl.inference.hf import HFEngine
from skyrl.inference.weight_sync import tensor_spec
from skyrl.models import build_tiny_model
from skyrl.workers.distributed import find_free_port


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    return HFEngine(build_tiny_model())


def test_a_misspelt_name_is_one_line_with_the_closest_names(engine):
    with pytest.raises(KeyError) as e:
        engine.update_weights({"model.embed_tokens.weigth": torch.zeros(1)})
    assert str(e.value) == (
        "update_weights: the model has no parameter 'model.embed_tokens.weigth'; "
        "closest: model.embed_tokens.weight, model.norm.weight"
    )


def test_a_name_close_to_nothing_shows_what_the_model_has(engine):
    with pytest.raises(KeyError) as e:
        engine.update_weights([("nope", torch.zeros(1))])
    assert str(e.value) == (
        "update_weights: the model has no parameter 'nope'; it has model.embed_tokens.weight, "
        "model.layers.0.self_attn.q_proj.weight, model.layers.0.self_attn.q_proj.bias, ..."
    )


def test_a_full_weight_for_a_lora_adapted_layer_says_what_the_engine_takes():
    """difflib's closest names were the other, unadapted projections (v_proj, o_proj)."""
    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj"])
    engine = HFEngine(build_tiny_model(), lora=dataclasses.asdict(lora))
    with pytest.raises(KeyError) as e:
        engine.update_weights({"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64)})
    assert str(e.value) == (
        "update_weights: the model has no parameter 'model.layers.0.self_attn.q_proj.weight'; "
        "the engine serves a LoRA adapter on that layer: it takes the adapter's tensors "
        "(lora_A / lora_B), and the layer's own as "
        "'model.layers.0.self_attn.q_proj.base_layer.weight'"
    )


def test_an_update_with_one_bad_name_loads_nothing(engine):
    """The good tensor came first and was loaded before the bad name raised."""
    embedding = engine.model.get_input_embeddings().weight
    before = embedding.detach().clone()
    with pytest.raises(KeyError, match="no parameter 'lm_head.weigth'"):
        engine.update_weights(
            {"model.embed_tokens.weight": torch.zeros_like(before), "lm_head.weigth": 0 * before}
        )
    assert torch.equal(embedding, before)


def test_a_broadcast_plan_the_engine_cannot_take_releases_the_sender(tmp_path):
    """The bad name is in the first of two buckets: the engine raised there and the sender
    waited in the second bucket's broadcast until its gloo timeout (60 s in the sender)."""
    engine = HFEngine(build_tiny_model())
    norm = engine.model.model.norm.weight
    weights = {"lm_head.weigth": torch.ones(468, 64), "model.norm.weight": torch.zeros(64)}
    plan = [[tensor_spec(n, t.shape, t.dtype)] for n, t in weights.items()]
    before = norm.detach().clone()
    port = find_free_port()
    sender = start_sender(tmp_path, weights, plan, port, world_size=2)
    engine.join_weight_sync("127.0.0.1", port, 1, 2, "gloo")
    with pytest.raises(KeyError, match="no parameter 'lm_head.weigth'; closest: lm_head.weight"):
        engine.receive_weights(plan)
    sender.communicate(timeout=30)  # the sender sent both buckets and ended
    assert sender.returncode == 0
    assert torch.equal(norm, before)  # nothing loaded


def test_a_good_broadcast_still_loads(tmp_path):
    engine = HFEngine(build_tiny_model())
    weights = {"model.norm.weight": torch.full((64,), 2.0)}
    plan = [[tensor_spec(n, t.shape, t.dtype) for n, t in weights.items()]]
    port = find_free_port()
    sender = start_sender(tmp_path, weights, plan, port, world_size=2)
    engine.join_weight_sync("127.0.0.1", port, 1, 2, "gloo")
    engine.receive_weights(plan)
    finish(sender)
    assert torch.equal(engine.model.model.norm.weight, weights["model.norm.weight"])


def test_receive_before_join_and_update_after_shutdown_say_so():
    """Both were an AttributeError (no ``sync_group``; ``'NoneType' object has no attribute
    'named_parameters'``)."""
    engine = HFEngine(build_tiny_model())
    with pytest.raises(RuntimeError, match=r"^hf engine: receive_weights before join_weight_sync$"):
        engine.receive_weights([[("model.norm.weight", [64], "float32")]])
    engine.shutdown()
    with pytest.raises(RuntimeError, match=r"^hf engine: update_weights after shutdown\(\)$"):
        engine.update_weights({"model.norm.weight": torch.zeros(64)})
