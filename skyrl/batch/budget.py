"""What bounds ``trainer.micro_batch_max_tokens`` (the memory one packed micro batch needs)
and the sequences in it (the model's context).

A packed micro batch is one row of several sequences, each with its own position ids
restarting at 0; each attends only to itself (``skyrl.workers.packed_attention``), so the
budget may exceed one sample's length (bigger matmuls run closer to the machine's peak) and
the model's context too: what the model attends over is one sequence, never the row. So:

- the model's context (``max_position_embeddings``) bounds the longest sequence,
  ``generator.max_prompt_length + generator.max_generate_length`` (a packed row longer than
  the context computes exactly what its sequences compute alone:
  ``tests/workers/test_packed_attention.py``);
- memory bounds the budget: an estimate of the activations one micro batch keeps for the
  backward pass, on every rank at once, must fit in half of this machine's memory (CPU
  ranks; on GPU the device's own limit applies at run time). A sequence longer than the
  budget is packed alone, so the estimate is of the budget or the longest sequence,
  whichever is longer.

Unset, the budget is ``DEFAULT_MICRO_BATCH_TOKENS`` (or the longest sequence) on CPU ranks;
a GPU rank grows it by powers of two up to ``GPU_MAX_DEFAULT_TOKENS`` while the estimate
fits half of that GPU's free memory once the model and its optimizer state are on it
(``gpu_micro_batch_tokens``). The estimate (fp32 or bf16 by ``trainer.precision``): per
token, per layer ``34 x hidden`` values (Korthikanti et al. 2022, memory-efficient
attention: no ``T^2`` term), or ``2 x hidden`` with gradient checkpointing plus one layer's
full set; plus the logits, their log-softmax and its gradient, ``3 x vocab`` fp32 values per
token.
"""

from __future__ import annotations

import os

from skyrl.config.errors import require
from skyrl.config.root import SkyRLConfig

MEMORY_SHARE = 0.5
"""Share of the machine's memory the ranks' micro-batch activations may take together."""

DEFAULT_MICRO_BATCH_TOKENS = 2048
"""The budget when ``trainer.micro_batch_max_tokens`` is unset on CPU ranks, and the least
on GPU ranks (or the longest sequence, if longer). Measured on SmolLM2 (``tests/bench/bench_micro_batch.py``, 16 sequences of <= 108
tokens, 1192 real tokens, one optimizer step): 1 rank x 2 threads 47 / 70 / 77 / 87 train tok/s
at budgets 108 / 512 / 1024 / 2048; 2 ranks x 1 thread 55 / 73 / 75 / 72."""

GPU_MAX_DEFAULT_TOKENS = 32768
"""The most an unset budget grows to on a GPU rank. Measured on an H200 (``tests/bench/
bench_gpu.py``: SmolLM2-135M's shape in bf16, 256 sequences, 69336 tokens, one optimizer
step): train tok/s 7410 / 12887 / 30436 / 61022 / 100671 / 138988 / 148995 at budgets 1024 /
2048 / 4096 / 8192 / 16384 / 32768 / 65536, peak GPU memory 3.7 / 4.8 / 6.7 / 10.5 / 18.1 /
32.8 / 57.6 GiB. The CPU default runs 10.8x slower there than 32768; doubling past it gains 7%
for 1.8x the memory."""


def micro_batch_tokens(cfg: SkyRLConfig) -> int:
    """The token budget of one micro batch: ``trainer.micro_batch_max_tokens``, or the longer
    of ``DEFAULT_MICRO_BATCH_TOKENS`` and the longest sequence."""
    set_budget = cfg.trainer.micro_batch_max_tokens
    return set_budget or max(cfg.generator.max_seq_len, DEFAULT_MICRO_BATCH_TOKENS)


def gpu_micro_batch_tokens(cfg: SkyRLConfig, model_config, free_bytes: int) -> int:
    """The budget of a GPU rank with ``free_bytes`` of its memory free: the set one, or the
    largest power of two up to ``GPU_MAX_DEFAULT_TOKENS`` whose activation estimate fits
    ``MEMORY_SHARE`` of ``free_bytes``; never below the CPU default (``micro_batch_tokens``),
    which holds the longest sequence. The model's context bounds each sequence, not the
    budget (the pre-flight checks the sequences)."""
    floor = micro_batch_tokens(cfg)
    t = cfg.trainer
    if t.micro_batch_max_tokens:
        return floor
    budget = GPU_MAX_DEFAULT_TOKENS
    while (
        budget > floor
        and activation_bytes(model_config, budget, t.precision, t.gradient_checkpointing)
        > MEMORY_SHARE * free_bytes
    ):
        budget //= 2
    return max(budget, floor)


def text_config(model_dir: str, trust_remote_code: bool):
    """The language model's config of the model in ``model_dir`` (a multimodal model's
    ``text_config``)."""
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    return getattr(model_config, "text_config", None) or model_config


def activation_bytes(
    model_config, tokens: int, precision: str, checkpointing: bool, logits: bool = True
) -> int:
    """Estimated bytes of the activations a micro batch of ``tokens`` keeps for backward;
    ``logits=False``: a value model's (the critic's head has one output, no vocabulary)."""
    hidden = int(model_config.hidden_size)
    layers = int(model_config.num_hidden_layers)
    width = 2 if precision == "bf16" else 4
    per_layer = 34 * hidden * width
    kept_layers = (
        per_layer * layers if not checkpointing else (2 * hidden * width * layers + per_layer)
    )
    return tokens * (kept_layers + (3 * int(model_config.vocab_size) * 4 if logits else 0))


def machine_memory_bytes() -> int:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_context(cfg: SkyRLConfig, model_config, context_of: str = "the model's context") -> None:
    """The longest sequence within the context of the model whose (text) config is
    ``model_config`` (``context_of``: how the message names that); a ``ConfigError``
    otherwise."""
    g = cfg.generator
    context = getattr(model_config, "max_position_embeddings", None)
    require(
        context is None or g.max_seq_len <= context,
        "generator.max_generate_length",
        f"a sequence of up to generator.max_prompt_length + generator.max_generate_length = "
        f"{g.max_prompt_length} + {g.max_generate_length} = {g.max_seq_len} tokens exceeds "
        f"{context_of}, max_position_embeddings = {context}",
    )


def check_micro_batch_budget(cfg: SkyRLConfig, model_config) -> None:
    """The longest sequence within the context of the model whose (text) config is
    ``model_config`` and its micro batches within the memory estimate
    (``check_activation_memory``); a ``ConfigError`` naming the key to change otherwise."""
    check_context(cfg, model_config)
    check_activation_memory(cfg, model_config)


def check_activation_memory(cfg: SkyRLConfig, model_config, critic_key: str | None = None) -> None:
    """On CPU ranks, the micro batches of the longest sequence and of
    ``trainer.micro_batch_max_tokens`` within the memory estimate for the model whose (text)
    config is ``model_config`` (``critic_key``: the critic's, a value model, named so); a
    ``ConfigError`` naming the key to change otherwise (the sequence length where the longest
    sequence alone is over: no budget makes its micro batch smaller)."""
    t, g = cfg.trainer, cfg.generator
    budget = micro_batch_tokens(cfg)
    if t.num_gpus_per_worker > 0:
        return
    total = machine_memory_bytes()
    whose = f" for the critic ({critic_key})" if critic_key else ""

    def over(tokens: int) -> str | None:
        """What micro batches of ``tokens`` need on every rank at once, if more than fits."""
        need = t.dp_size * activation_bytes(
            model_config, tokens, t.precision, t.gradient_checkpointing, not critic_key
        )
        if need <= MEMORY_SHARE * total:
            return None
        return (
            f"need about {need / 2**30:.1f} GiB of activations{whose} on {t.dp_size} rank(s), "
            f"over {MEMORY_SHARE:.0%} of this machine's {total / 2**30:.1f} GiB"
        )

    # a sequence longer than the budget is packed alone: no budget makes the longest
    # sequence's micro batch smaller, so that one names the sequence length
    seq_len = g.max_seq_len
    seq_over = over(seq_len)
    if seq_len > budget:
        what = (
            f"a sequence of up to {seq_len} tokens (longer than trainer.micro_batch_max_tokens = "
            f"{budget}) is a micro batch of its own, and such micro batches"
        )
    else:
        what = (
            "a sequence of up to generator.max_prompt_length + generator.max_generate_length = "
            f"{g.max_prompt_length} + {g.max_generate_length} = {seq_len} tokens makes micro "
            "batches of at least that many tokens, which"
        )
    require(
        seq_over is None,
        "generator.max_generate_length",
        f"{what} {seq_over}; shorten generator.max_prompt_length + "
        "generator.max_generate_length or set trainer.gradient_checkpointing=true",
    )
    budget_over = over(budget)
    require(
        budget_over is None,
        "trainer.micro_batch_max_tokens",
        f"{budget} tokens per micro batch {budget_over}; "
        f"{'lower it' if t.micro_batch_max_tokens else 'set it lower'} "
        "or set trainer.gradient_checkpointing=true",
    )
