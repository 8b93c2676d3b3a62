"""CISPO: REINFORCE with a clipped, stop-gradient importance-sampling weight.

MiniMax-M1 (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently
with Lightning Attention"), eq. 4-5: per token with r_t = pi(y_t) / pi_old(y_t),

    L_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A_t * log pi(y_t)

so no token's gradient is dropped (unlike the PPO clip); only the IS weight is
bounded. The paper sets no lower bound: use ``eps_clip_low = 1`` (weight >= 0).
With ``tis_cap`` each L_t is also multiplied by the truncated rollout IS weight.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.policy_losses.terms import (
    approx_kl,
    check_policy_inputs,
    masked_log_ratio,
    tis_weights,
    token_counts,
    token_sums,
    weighted_sum,
)
from skyrl.algorithms.registry import POLICY_LOSSES
from skyrl.config.algorithm import AlgorithmConfig


@POLICY_LOSSES.register("cispo")
def cispo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_weights: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-IS-weighted REINFORCE; ``clip_tokens`` counts tokens whose weight was clipped."""
    check_policy_inputs(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
        loss_weights=loss_weights, loss_mask=loss_mask, rollout_logprobs=rollout_logprobs,
    )  # fmt: skip
    mask = loss_mask > 0
    log_ratio = masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio).detach()
    low, high = 1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high
    is_weight = ratio.clamp(low, high)
    adv = torch.where(mask, advantages, 0.0)
    per_token = -is_weight * adv * torch.where(mask, logprobs, 0.0)
    tis, tis_metrics = tis_weights(old_logprobs, rollout_logprobs, mask, cfg)
    if tis is not None:
        per_token = per_token * tis
    metrics = token_counts(mask, clip=(ratio < low) | (ratio > high))
    metrics.update(token_sums(mask, approx_kl=approx_kl(log_ratio)), **tis_metrics)
    return weighted_sum(per_token, loss_weights, mask), metrics
