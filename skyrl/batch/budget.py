"""What bounds ``trainer.micro_batch_max_tokens``: the model's context and the memory one
packed micro batch needs.

A packed micro batch is one row of several sequences, each with its own position ids; each
attends only to itself (``skyrl.workers.packed_attention``), so the budget may
exceed one sample's length (bigger matmuls run closer to the machine's peak),
bounded by:

- the model's context (``max_position_embeddings``): the packed row goes through the model
  as one row of that many tokens;
- memory: an estimate of the activations one micro batch keeps for the backward pass, on
  every rank at once, must fit in half of this machine's memory (CPU ranks; on GPU the
  device's own limit applies at run time). The estimate (fp32 or bf16 by
  ``trainer.precision``): per token, per layer ``34 x hidden`` values (Korthikanti et al.
  2022, memory-efficient attention: no ``T^2`` term), or ``2 x hidden`` with gradient
  checkpointing plus one layer's full set; plus the logits, their log-softmax and its
  gradient, ``3 x vocab`` fp32 values per token.
"""

from __future__ import annotations

import os

from skyrl.config.errors import require
from skyrl.config.root import SkyRLConfig

MEMORY_SHARE = 0.5
"""Share of the machine's memory the ranks' micro-batch activations may take together."""

DEFAULT_MICRO_BATCH_TOKENS = 2048
"""The budget when ``trainer.micro_batch_max_tokens`` is unset (or the longest sequence, if
longer). Measured on SmolLM2 (``tests/bench/bench_micro_batch.py``, 16 sequences of <= 108
tokens, 1192 real tokens, one optimizer step): 1 rank x 2 threads 47 / 70 / 77 / 87 train tok/s
at budgets 108 / 512 / 1024 / 2048; 2 ranks x 1 thread 55 / 73 / 75 / 72."""


def micro_batch_tokens(cfg: SkyRLConfig) -> int:
    """The token budget of one micro batch: ``trainer.micro_batch_max_tokens``, or the longer
    of ``DEFAULT_MICRO_BATCH_TOKENS`` and the longest sequence."""
    set_budget = cfg.trainer.micro_batch_max_tokens
    return set_budget or max(cfg.generator.max_seq_len, DEFAULT_MICRO_BATCH_TOKENS)


def activation_bytes(model_config, tokens: int, precision: str, checkpointing: bool) -> int:
    """Estimated bytes of the activations a micro batch of ``tokens`` keeps for backward."""
    hidden = int(model_config.hidden_size)
    layers = int(model_config.num_hidden_layers)
    vocab = int(model_config.vocab_size)
    width = 2 if precision == "bf16" else 4
    per_layer = 34 * hidden * width
    kept_layers = (
        per_layer * layers if not checkpointing else (2 * hidden * width * layers + per_layer)
    )
    return tokens * (kept_layers + 3 * vocab * 4)


def machine_memory_bytes() -> int:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_micro_batch_budget(cfg: SkyRLConfig, model_dir: str) -> None:
    """``trainer.micro_batch_max_tokens`` within the model's context (when set: the default
    only packs sequences that fit the model anyway) and, on CPU ranks, the memory estimate;
    a ``ConfigError`` naming the key otherwise."""
    from transformers import AutoConfig

    t = cfg.trainer
    budget = micro_batch_tokens(cfg)
    model_config = AutoConfig.from_pretrained(
        model_dir, trust_remote_code=cfg.model.trust_remote_code
    )
    model_config = getattr(model_config, "text_config", None) or model_config
    context = getattr(model_config, "max_position_embeddings", None)
    require(
        context is None or budget <= context or t.micro_batch_max_tokens is None,
        "trainer.micro_batch_max_tokens",
        f"{budget} exceeds the model's context, max_position_embeddings = {context}",
    )
    if t.num_gpus_per_worker > 0:
        return
    need = t.dp_size * activation_bytes(model_config, budget, t.precision, t.gradient_checkpointing)
    total = machine_memory_bytes()
    require(
        need <= MEMORY_SHARE * total,
        "trainer.micro_batch_max_tokens",
        f"{budget} tokens per micro batch need about {need / 2**30:.1f} GiB of activations on "
        f"{t.dp_size} rank(s), over {MEMORY_SHARE:.0%} of this machine's "
        f"{total / 2**30:.1f} GiB; {'lower it' if t.micro_batch_max_tokens else 'set it lower'} "
        "or set trainer.gradient_checkpointing=true",
    )
