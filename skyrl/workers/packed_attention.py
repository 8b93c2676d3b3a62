"""Attention over a packed micro batch that computes only each sequence's own block.

A packed micro batch is one row ``[1, T]`` of several sequences with position ids restarting
at 0 per sequence (``skyrl.batch.packing``). transformers' ``sdpa`` attention confines it
with a block-diagonal ``[T, T]`` mask, but the kernel still computes every block, the
cross-sequence ones included, so its cost grows with ``T^2`` instead of the sum of the
sequences' squares. Measured here (SmolLM2 shapes: 9 query heads, 3 KV heads, head dim 64;
forward + backward, one thread; sequences of 100 tokens): T=500 51 vs 14 ms, T=1000 182 vs
30 ms, T=2000 725 vs 50 ms per layer, masked vs per sequence. That made budgets above one
sequence's length no faster.

``per_sequence`` (registered with transformers as ``skyrl_per_sequence``) splits the row at
the position-id restarts and runs causal SDPA on each sequence (grouped-query heads without
copies), which is what flash-attention's varlen path does on a GPU. ``masked`` keeps
transformers' ``sdpa``. ``trainer.packed_attention`` picks one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PER_SEQUENCE = "skyrl_per_sequence"
"""The attention implementation's name in transformers' registries."""

IMPLEMENTATIONS = {"per_sequence": PER_SEQUENCE, "masked": "sdpa"}
"""``trainer.packed_attention`` -> the model's ``attn_implementation``."""


def sequence_lengths(position_ids: torch.Tensor) -> list[int]:
    """Lengths of the sequences in one packed row, from position ids restarting at 0."""
    starts = torch.nonzero(position_ids == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = [*starts[1:], position_ids.numel()]
    return [end - start for start, end in zip(starts, ends, strict=True)]


def per_sequence_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` ``[1, heads, T, d]``, ``key``/``value``
    ``[1, kv_heads, T, d]`` -> ``[1, T, heads, d]``. Causal attention within each sequence.

    Anything but one packed row (a padded batch with a 2D attention mask, a KV cache: the
    model used outside the workers' forward) goes to transformers' sdpa with a causal mask."""
    packed_row = query.shape[0] == 1 and query.shape[2] == key.shape[2]  # no KV cache
    if attention_mask is not None or position_ids is None or not packed_row:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    lengths = sequence_lengths(position_ids[0])
    if sliding_window is not None and max(lengths) > sliding_window:
        raise ValueError(
            f"a sequence of {max(lengths)} tokens exceeds the model's sliding window "
            f"({sliding_window}); set trainer.packed_attention=masked"
        )
    outputs = [
        F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=True
        )
        for q, k, v in zip(
            query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2), strict=True
        )
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs):
    """transformers' sdpa; the 2D padding mask (what the flash-style mask function leaves) made
    causal first, and a query that may see no key at all (left padding) sees every key: its
    output is padding, and this keeps it finite."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = attention_mask
    if mask is not None and mask.dim() == 2:
        q_len, kv_len = query.shape[2], key.shape[2]
        causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device)
        mask = causal.tril(kv_len - q_len)[None, None] & mask.bool()[:, None, None, :]
        mask = mask | ~mask.any(-1, keepdim=True)
    return sdpa_attention_forward(
        module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs
    )


def register() -> None:
    """Make ``skyrl_per_sequence`` a valid ``attn_implementation`` in this process: the
    attention function, and no mask (like flash-attention: none is built for a packed row)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(PER_SEQUENCE, per_sequence_attention)
    AttentionMaskInterface.register(PER_SEQUENCE, flash_attention_mask)
