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
starts (``PackedMicroBatch.parents`` says which output predicts which token, so a
prompt packed once for several rows works the same). Log-softmax is evaluated over
chunks of tokens so no full-vocab fp32 copy of all logits is made at once.
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


def _chunk_log_z(
    logits: torch.Tensor, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per position: ``log Z`` of the tempered logits, and the entropy of their softmax."""
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    log_z = torch.logsumexp(scaled, dim=-1)
    if not compute_entropy:
        return log_z, None
    probs = torch.softmax(scaled, dim=-1)
    return log_z, log_z - (probs * scaled).sum(-1)


def packed_logprobs(
    model: torch.nn.Module,
    micro_batch: PackedMicroBatch,
    temperature: float = 1.0,
    compute_entropy: bool = False,
) -> PackedForward:
    """Forward one packed micro batch; per-token logprobs ``[1, T]`` (and entropy).

    ``model`` is a causal LM returning ``.logits`` (a DeepSpeed engine wrapping
    one works too). Gradients flow when enabled. The token at position ``t`` is predicted
    by the output at ``micro_batch.parents[t]``: ``t - 1`` within a sequence, a shared
    prompt's last position for a continuation's first token.
    """
    input_ids = micro_batch.input_ids
    position_ids = micro_batch.position_ids.to(input_ids.device)
    logits = model(
        input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=False
    ).logits[0]
    num_tokens = input_ids.shape[1]
    pieces_z: list[torch.Tensor] = []
    pieces_ent: list[torch.Tensor] = []
    for start in range(0, num_tokens, TOKEN_CHUNK):
        log_z, ent = _chunk_log_z(logits[start : start + TOKEN_CHUNK], temperature, compute_entropy)
        pieces_z.append(log_z)
        if ent is not None:
            pieces_ent.append(ent)
    parents = micro_batch.parents.to(input_ids.device)
    starts = parents < 0
    source = parents.clamp(min=0)
    # Every position has a predictor, so the result always has a graph: a one-token
    # (filler) micro batch must still backpropagate, or DeepSpeed rejects the loss.
    picked = logits[source, input_ids[0]].float()
    if temperature != 1.0:
        picked = picked / temperature
    logprobs = (picked - torch.cat(pieces_z)[source]).masked_fill(starts, 0.0).unsqueeze(0)
    entropy = None
    if compute_entropy:
        entropy = torch.cat(pieces_ent)[source].masked_fill(starts, 0.0).unsqueeze(0)
    return PackedForward(logprobs, entropy)
