"""``skyrl.models.lora``: a run's ``final_adapter`` directory, recognised and merged into the
base model it names (what ``skyrl-eval`` evaluates)."""

from __future__ import annotations

import pytest
from lora_adapters import assert_merged_as_served, trained_adapters  # tests/ is on sys.path
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.config.root import LoraConfig
from skyrl.models.lora import (
    add_adapters,
    is_adapter_dir,
    merge_adapter_dir,
    write_adapter_dir,
)
from skyrl.models.tiny import build_tiny_model


def test_an_adapter_directory_merges_into_the_model_peft_serves(tmp_path):
    base = build_tiny_model()
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base), LoraConfig(rank=4, alpha=8))
    adapter = trained_adapters(model)
    adapter_dir = write_adapter_dir(tmp_path / "final_adapter", adapter, LoraConfig(4, 8), base)
    assert is_adapter_dir(adapter_dir) and not is_adapter_dir(base)

    merged_dir = merge_adapter_dir(adapter_dir, base, base, tmp_path / "merged")
    assert AutoTokenizer.from_pretrained(merged_dir).vocab_size > 0
    assert_merged_as_served(merged_dir, base, adapter_dir)


def test_gpt2_style_conv1d_layers_are_linear_layers_peft_adapts(tmp_path):
    # GPT-2's attention and MLP projections are transformers' Conv1D (a linear layer with its
    # weight transposed), which PEFT adapts: c_attn was refused, listing no linear layer
    from transformers import GPT2Config

    from skyrl.config import ConfigError
    from skyrl.models.lora import check_target_modules

    config = GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=512, eos_token_id=0)
    config.bos_token_id = 0
    config.save_pretrained(tmp_path)
    check_target_modules(
        LoraConfig(rank=8, target_modules=["c_attn", "mlp.c_proj"]), tmp_path, False
    )
    with pytest.raises(ConfigError) as err:
        check_target_modules(LoraConfig(rank=8, target_modules=["c_attnn"]), tmp_path, False)
    assert (err.value.key, err.value.message) == (
        "model.lora.target_modules[0]",
        "'c_attnn' names no linear layer of GPT2LMHeadModel (the output layer takes no "
        "adapter); its linear layers: c_attn, c_fc, c_proj",
    )


def test_the_merged_export_is_the_base_plus_scaled_b_times_a(tmp_path):
    # rank 4, alpha 8: each adapted weight becomes W0 + (8 / 4) x B @ A; no other weight moves
    import torch
    from safetensors.torch import load_file

    from skyrl.models.lora import ADAPTER_WEIGHTS, is_adapter_name, wire_name

    base = build_tiny_model()
    base_weights = AutoModelForCausalLM.from_pretrained(base).state_dict()
    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "down_proj"])
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base), lora)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_adapter_name(name):  # B = 0 at init: give B (and A) values of their own
                param.copy_(torch.randn(param.shape, generator=generator))
    adapter = {wire_name(n): p.detach() for n, p in model.named_parameters() if is_adapter_name(n)}
    adapter_dir = write_adapter_dir(tmp_path / "final_adapter", adapter, lora, base)
    assert load_file(adapter_dir / ADAPTER_WEIGHTS).keys() == adapter.keys()

    merged = AutoModelForCausalLM.from_pretrained(
        merge_adapter_dir(adapter_dir, base, base, tmp_path / "merged")
    ).state_dict()
    assert merged.keys() == base_weights.keys()
    adapted = [k for k in base_weights if k.endswith(("q_proj.weight", "down_proj.weight"))]
    assert len(adapted) == 2 * 2  # two layers, two targets each
    for key, w0 in base_weights.items():
        if key not in adapted:
            assert torch.equal(merged[key], w0), key
            continue
        module = f"base_model.model.{key.removesuffix('.weight')}"
        a, b = adapter[f"{module}.lora_A.weight"], adapter[f"{module}.lora_B.weight"]
        torch.testing.assert_close(merged[key], w0 + 2.0 * b @ a, rtol=0, atol=1e-6)
