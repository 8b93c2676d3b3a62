"""``write_adapter_dir``'s ``target_modules``: PEFT loading the exported adapter puts LoRA layers
on exactly the modules the run adapted, not on every module sharing their last name."""

from __future__ import annotations

import warnings

import torch
from lora_adapters import assert_merged_as_served, trained_adapters  # tests/ is on sys.path
from transformers import GPT2Config, GPT2LMHeadModel

from skyrl.config.root import LoraConfig
from skyrl.models.lora import add_adapters, merge_adapter_dir, write_adapter_dir
from skyrl.models.tiny import build_tiny_model


def _lora_modules(model: torch.nn.Module) -> list[str]:
    """The base-model names of ``model``'s modules that hold a LoRA adapter."""
    return sorted(
        name.removeprefix("base_model.model.")
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and hasattr(module, "base_layer")
    )


def test_an_exported_mlp_c_proj_adapter_loads_on_the_mlp_c_proj_layers_only(tmp_path):
    # GPT-2 has two layers named c_proj per block (attn.c_proj, mlp.c_proj); the run adapts
    # mlp.c_proj only. Exported as "c_proj", PEFT attached zero adapters to attn.c_proj too
    # (and warned of their missing keys).
    from peft import PeftModel

    config = GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=512, eos_token_id=0)
    config.bos_token_id = 0
    torch.manual_seed(0)
    base = str(tmp_path / "gpt2")
    GPT2LMHeadModel(config).save_pretrained(base)
    lora = LoraConfig(rank=4, alpha=8, target_modules=["mlp.c_proj"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT: fan_in_fan_out set for Conv1D
        model = add_adapters(GPT2LMHeadModel.from_pretrained(base), lora)
    trained = ["transformer.h.0.mlp.c_proj", "transformer.h.1.mlp.c_proj"]
    assert _lora_modules(model) == trained
    adapter_dir = write_adapter_dir(tmp_path / "final_adapter", trained_adapters(model), lora, base)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        served = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base), adapter_dir)
    assert _lora_modules(served) == trained
    assert not [w for w in caught if "missing adapter keys" in str(w.message)]

    tokenizer = build_tiny_model()  # any tokenizer: the merge only copies its files
    merged_dir = merge_adapter_dir(adapter_dir, base, tokenizer, tmp_path / "merged")
    assert_merged_as_served(merged_dir, base, adapter_dir)
