"""Token entropy of the policy from logits, chunked over tokens to bound memory.

``H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_tv``; a ``-inf`` logit (a masked vocabulary
entry) has probability 0 and adds nothing. The float32 softmax of a ``[chunk_size, V]`` block
is the only full-vocab copy alive at a time; under autograd each chunk is recomputed in
backward (activation checkpointing), so the saved state is the logits themselves, not a
float32 copy per token.

Use as a bonus: ``loss = policy_loss - entropy_coef * entropy_bonus(H, w, mask)``,
where ``entropy_bonus`` reduces H with the same mini-batch weights as the loss.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from skyrl.algorithms.shapes import check_same_shape

DEFAULT_CHUNK_TOKENS = 1024
"""Tokens per chunk: chunk_tokens x vocab float32 values live at once."""


def _chunk_entropy(logits: torch.Tensor) -> torch.Tensor:
    z = logits.float()
    log_z = torch.logsumexp(z, dim=-1)
    probs = torch.softmax(z, dim=-1)
    # p log p -> 0 as p -> 0: a -inf logit (p = 0) adds 0, not 0 * -inf = NaN, to value and gradient
    z_seen = torch.where(probs > 0, z, 0.0)
    return log_z - (probs * z_seen).sum(dim=-1)


def entropy_from_logits(
    logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_TOKENS
) -> torch.Tensor:
    """Per-token entropy (nats, float32) of ``logits [..., V]``, shape ``[...]``."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    flat = logits.reshape(-1, logits.shape[-1])
    use_checkpoint = torch.is_grad_enabled() and logits.requires_grad
    chunks = []
    for start in range(0, flat.shape[0], chunk_size):
        block = flat[start : start + chunk_size]
        if use_checkpoint:
            chunks.append(checkpoint(_chunk_entropy, block, use_reentrant=False))
        else:
            chunks.append(_chunk_entropy(block))
    out = torch.cat(chunks) if chunks else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])


def entropy_bonus(
    entropy: torch.Tensor, loss_weights: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """``sum_t w_t H_t`` over loss tokens: the entropy reduced like the policy loss."""
    check_same_shape(entropy=entropy, loss_weights=loss_weights, loss_mask=loss_mask)
    return torch.where(loss_mask > 0, entropy * loss_weights, 0.0).sum()
