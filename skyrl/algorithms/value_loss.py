"""Critic loss: clipped value regression toward the GAE returns.

PPO (Schulman et al. 2017) as implemented in OpenAI baselines ``ppo2``:

    V_clip = V_old + clip(V - V_old, -c, c)
    L_t    = 1/2 * max((V - R)^2, (V_clip - R)^2)

with c = ``value_clip``; ``value_clip = 0`` turns clipping off (plain 1/2 (V - R)^2).
Reduced with the mini-batch weights: ``loss = sum_t w_t L_t``.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.shapes import check_same_shape


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_weights: torch.Tensor,
    loss_mask: torch.Tensor,
    value_clip: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(loss, metrics)``; metrics are additive: ``loss_tokens``, ``vf_clip_tokens``, ``value_error_sum``."""
    check_same_shape(
        values=values,
        old_values=old_values,
        returns=returns,
        loss_weights=loss_weights,
        loss_mask=loss_mask,
    )
    mask = loss_mask > 0
    v = torch.where(mask, values, 0.0)
    v_old = torch.where(mask, old_values, 0.0)
    r = torch.where(mask, returns, 0.0)
    unclipped = (v - r) ** 2
    per_token = unclipped
    clipped_used = torch.zeros_like(mask)
    if value_clip > 0:
        # inside the range V_clip is V itself: V_old + (V - V_old) can round one ulp away
        # and be counted as clipped
        outside = (v - v_old).abs() > value_clip
        v_clipped = torch.where(outside, v_old + (v - v_old).clamp(-value_clip, value_clip), v)
        clipped = (v_clipped - r) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipped_used = clipped > unclipped
    loss = torch.where(mask, 0.5 * per_token * loss_weights, 0.0).sum()
    metrics = {
        "loss_tokens": float(mask.sum()),
        "vf_clip_tokens": float((clipped_used & mask).sum()),
        "value_error_sum": float(torch.where(mask, unclipped.detach(), 0.0).sum()),
    }
    return loss, metrics
