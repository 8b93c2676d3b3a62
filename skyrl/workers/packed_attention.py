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
copies), which is what flash-attention's varlen path does on a GPU. It also runs a prompt that
several rows share, packed once (``trainer.share_prompts``): each row's continuation attends
to the prompt's keys and causally to its own. ``masked`` keeps transformers' ``sdpa`` (no
shared prompts: its block-diagonal mask cannot express them). ``trainer.packed_attention``
picks one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PER_SEQUENCE = "skyrl_per_sequence"
"""The attention implementation's name in transformers' registries."""

IMPLEMENTATIONS = {"per_sequence": PER_SEQUENCE, "masked": "sdpa"}
"""``trainer.packed_attention`` -> the model's ``attn_implementation``."""


def attention_spans(position_ids: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """The spans of one packed row's position ids ``[T]``, as ``(start, end, prefix_start,
    prefix_length)``: the queries ``[start, end)`` attend causally to themselves and to all of
    ``[prefix_start, prefix_start + prefix_length)``.

    Positions restart at 0 where a sequence starts (a span with no prefix; so does the row's
    first span, wherever its positions begin); a jump back to
    ``p > 0`` starts a continuation of the sequence's first ``p`` tokens, a prompt several
    rows share (``skyrl.batch.packing``): its span's prefix. Any other jump is an error."""
    positions = position_ids.tolist()
    breaks = torch.nonzero(position_ids[1:] != position_ids[:-1] + 1).flatten().add(1).tolist()
    starts = [0, *breaks]
    ends = [*starts[1:], len(positions)]
    spans = []
    sequence_start = 0
    for start, end in zip(starts, ends, strict=True):
        first = positions[start]
        if first == 0 or start == 0:  # a row may begin mid-sequence: its first span
            sequence_start = start
            spans.append((start, end, start, 0))
        elif first <= positions[start - 1] and sequence_start + first <= start:
            spans.append((start, end, sequence_start, first))
        else:
            raise ValueError(
                f"position ids jump from {positions[start - 1]} to {first} at {start}: "
                "neither a new sequence (0) nor a continuation of a shared prefix"
            )
    return spans


def _continuation_mask(prefix: int, length: int, device: torch.device) -> torch.Tensor:
    """``[length, prefix + length]`` bool: every prefix key, then causal over its own keys."""
    own = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return torch.cat([own.new_ones(length, prefix), own], dim=1)


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
    ``[1, kv_heads, T, d]`` -> ``[1, T, heads, d]``. Causal attention within each sequence;
    a continuation of a shared prompt also sees that prompt (``attention_spans``).

    Anything but one packed row (a padded batch with a 2D attention mask, a KV cache: the
    model used outside the workers' forward) goes to transformers' sdpa with a causal mask."""
    packed_row = query.shape[0] == 1 and query.shape[2] == key.shape[2]  # no KV cache
    if attention_mask is not None or position_ids is None or not packed_row:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    spans = attention_spans(position_ids[0])
    longest = int(position_ids.max()) + 1
    if sliding_window is not None and longest > sliding_window:
        raise ValueError(
            f"a sequence of {longest} tokens exceeds the model's sliding window "
            f"({sliding_window}); set trainer.packed_attention=masked"
        )
    outputs = []
    for start, end, prefix_start, prefix in spans:
        q = query[:, :, start:end]
        if not prefix:
            outputs.append(
                F.scaled_dot_product_attention(
                    q,
                    key[:, :, start:end],
                    value[:, :, start:end],
                    dropout_p=dropout,
                    is_causal=True,
                    scale=scaling,
                    enable_gqa=True,
                )
            )
            continue
        shared = slice(prefix_start, prefix_start + prefix)
        outputs.append(
            F.scaled_dot_product_attention(
                q,
                torch.cat([key[:, :, shared], key[:, :, start:end]], dim=2),
                torch.cat([value[:, :, shared], value[:, :, start:end]], dim=2),
                attn_mask=_continuation_mask(prefix, end - start, query.device),
                dropout_p=dropout,
                scale=scaling,
                enable_gqa=True,
            )
        )
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
