"""Per-token logprobs (and entropy) of a packed micro batch.

The packed row ``[1, T]`` goes through the model with ``attention_mask=None``,
``position_ids`` restarting at 0 per sequence and ``use_cache=False``. The
workers' models attend per sequence from those position ids
(``skyrl.workers.packed_attention``, the default); with
``trainer.packed_attention=masked`` transformers'
``masking_utils.find_packed_sequence_indices`` confines sdpa to each sequence
with a block-diagonal causal mask instead. (With a KV cache or a 2D attention
mask the detection is off, hence both are omitted.)

Alignment matches ``TrainingInputBatch``: the value at position ``t`` is
``log p(token_t | tokens_<t)`` of the same sequence, 0 where a sequence
starts. Log-softmax is evaluated over chunks of tokens so no full-vocab fp32
copy of all logits is made at once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from skyrl.batch.packing import PackedMicroBatch

TOKEN_CHUNK = 1024
"""Tokens per log-softmax chunk: bounds the fp32 ``[chunk, vocab]`` temporaries."""


class PackedForward(NamedTuple):
    logprobs: torch.Tensor
    """``[1, T]`` fp32, aligned with ``input_ids`` (0 at each sequence start)."""
    entropy: torch.Tensor | None
    """``[1, T]`` entropy of the distribution that predicted token t, or None."""


def _chunk_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    log_z = torch.logsumexp(scaled, dim=-1)
    logprobs = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    if not compute_entropy:
        return logprobs, None
    probs = torch.softmax(scaled, dim=-1)
    entropy = log_z - (probs * scaled).sum(-1)
    return logprobs, entropy


def packed_logprobs(
    model: torch.nn.Module,
    micro_batch: PackedMicroBatch,
    temperature: float = 1.0,
    compute_entropy: bool = False,
) -> PackedForward:
    """Forward one packed micro batch; per-token logprobs ``[1, T]`` (and entropy).

    ``model`` is a causal LM returning ``.logits`` (a DeepSpeed engine wrapping
    one works too). Gradients flow when enabled.
    """
    input_ids = micro_batch.input_ids
    position_ids = micro_batch.position_ids.to(input_ids.device)
    logits = model(
        input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False
    ).logits[0]
    num_tokens = input_ids.shape[1]
    targets = input_ids[0, 1:]
    pieces_lp: list[torch.Tensor] = []
    pieces_ent: list[torch.Tensor] = []
    for start in range(0, num_tokens - 1, TOKEN_CHUNK):
        end = min(start + TOKEN_CHUNK, num_tokens - 1)
        lp, ent = _chunk_logprobs(
            logits[start:end], targets[start:end], temperature, compute_entropy
        )
        pieces_lp.append(lp)
        if ent is not None:
            pieces_ent.append(ent)
    # Prediction for token t comes from logits at t-1; zero where a sequence starts.
    starts = position_ids[0] == 0
    # The leading 0 is taken from the logits so the result always has a graph: a one-token
    # (filler) micro batch must still backpropagate, or DeepSpeed rejects the loss.
    zero = logits[:1, 0].float() * 0.0
    logprobs = torch.cat([zero, *pieces_lp]).masked_fill(starts, 0.0).unsqueeze(0)
    entropy = None
    if compute_entropy:
        entropy = torch.cat([zero, *pieces_ent]).masked_fill(starts, 0.0).unsqueeze(0)
    return PackedForward(logprobs, entropy)
