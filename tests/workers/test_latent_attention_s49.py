"""Multi-head latent attention (DeepSeek-V2/V3: values of another head size than queries and
keys) trains on packed micro batches: the packed attention runs SDPA per span, which takes
any value size, instead of the flash kernels, which take one head size.

Before: every forward of a DeepSeek-V2 model on CPU failed in the workers with
"RuntimeError: scaled_dot_product_attention_flash_attention: Q/K/V should have the same head
size" (on a GPU in bf16 the varlen flash kernel has the same rule)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from worker_helpers import packed_after_another_gap

from skyrl.workers.models import load_causal_lm


def test_latent_attention_packs_and_keeps_sequences_apart(tmp_path):
    config = CONFIG_MAPPING["deepseek_v2"](
        vocab_size=100,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=2,
        num_experts_per_tok=1,
        n_shared_experts=1,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=8,  # queries and keys 32, values 8
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    model = load_causal_lm(str(tmp_path / "model"), "fp32")
    ids = torch.randint(0, 100, (1, 20), generator=torch.Generator().manual_seed(1))
    assert packed_after_another_gap(model, ids) < 1e-5
