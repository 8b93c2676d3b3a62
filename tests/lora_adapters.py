"""Test helper: LoRA adapters that change the model (tests/ is on sys.path)."""

from __future__ import annotations

import torch

from skyrl.models.lora import is_adapter_name, wire_name


def trained_adapters(model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Set every LoRA ``B`` of ``model`` to random values ("trained": at B = 0 an adapter is a
    no-op) and return the adapter weights by their wire names, as ``write_adapter_dir`` takes
    them."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return {wire_name(n): p for n, p in model.named_parameters() if is_adapter_name(n)}


def assert_merged_as_served(merged_dir, base_dir, adapter_dir):
    """The model at ``merged_dir`` computes what PEFT serving ``adapter_dir`` on the base model
    at ``base_dir`` does, and the adapter changes the base model's logits. Returns that PEFT
    model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    served = PeftModel.from_pretrained(base, str(adapter_dir))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        a, b = merged(input_ids=ids).logits, served(input_ids=ids).logits
        with served.disable_adapter():
            without = served(input_ids=ids).logits
    # fp32 rounding of (W + BA) x against W x + B (A x): 1.2e-5 seen; the adapters themselves
    # move the logits by far more, so a merge that lost them could not pass
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert float((b - without).abs().max()) > 1e-2
    return served
