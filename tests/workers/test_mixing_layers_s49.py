"""A model with layers that mix tokens outside attention (Qwen3.5's and Qwen3-Next's linear
attention, Mamba, recurrence, short convolutions) is refused before anything starts: those
layers ran along the whole packed micro batch, so each sequence carried its state into the
next one packed after it.

Before: a tiny Qwen3-Next (linear attention, then full attention) loaded and trained with the
logits of a sequence packed after another 0.04 off its logits alone, silently; the pre-flight
passed it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3NextConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from worker_helpers import packed_after_another_gap

import skyrl
from skyrl.config import ConfigError
from skyrl.config.preflight import preflight
from skyrl.config.validate import validate
from skyrl.workers.models import load_causal_lm
from skyrl.workers.packed_attention import unimplemented_attention

TINY_QWEN3_NEXT = Qwen3NextConfig(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    layer_types=["linear_attention", "full_attention"],
    linear_num_value_heads=2,
    linear_num_key_heads=1,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    num_experts=2,
    num_experts_per_tok=1,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)

MIXING = (
    "has layers that mix tokens outside attention (state space, linear attention, recurrence "
    "or short convolutions), which skyrl's packed forward runs along the whole micro batch: "
    "the sequences packed in it would see each other"
)


def test_a_linear_attention_layer_carries_one_sequence_into_the_next_so_it_is_refused(tmp_path):
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(TINY_QWEN3_NEXT).save_pretrained(tmp_path / "model")
    path = str(tmp_path / "model")
    # why: the second of two sequences of 10 packed in one row, against it alone
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.randint(0, 100, (1, 20), generator=torch.Generator().manual_seed(1))
    assert packed_after_another_gap(model, ids) > 1e-3

    with pytest.raises(ValueError, match=r"\(qwen3_next\) has layers that mix tokens"):
        load_causal_lm(path, "fp32")


def test_the_preflight_refuses_qwen3_5s_text_model(tmp_path):
    config = CONFIG_MAPPING["qwen3_5_text"](
        vocab_size=100,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    assert "linear_attention" in config.layer_types  # Qwen3.5's layout: 3 linear, 1 full
    config.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").touch()  # the pre-flight reads no weights
    path = str(tmp_path / "model")
    overrides = ["data=fake", "environment.name=unused", f"model.path={path}"]
    cfg = validate(skyrl.compose(["experiment=smoke", *overrides]))
    with pytest.raises(ConfigError) as refused:
        preflight(cfg, for_run=False)
    assert (refused.value.key, refused.value.message) == (
        "model.path",
        f"{path} (qwen3_5_text) {MIXING}: the workers would compute another model's logprobs",
    )


def test_a_config_of_attention_layers_only_is_not_refused():
    config = CONFIG_MAPPING["lfm2"](
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2
    )
    config.layer_types = ["full_attention", "full_attention"]
    assert unimplemented_attention("m", config) is None
    config.layer_types = ["conv", "full_attention"]  # LFM2's short convolution
    assert unimplemented_attention("m", config) == f"m (lfm2) {MIXING}"
