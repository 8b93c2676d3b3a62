"""CISPO: REINFORCE with a clipped, stop-gradient importance-sampling weight.

MiniMax-M1 (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently
with Lightning Attention"), eq. 4-5: per token with r_t = pi(y_t) / pi_old(y_t),

    L_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A_t * log pi(y_t)

so no token's gradient is dropped (unlike the PPO clip); only the IS weight is
bounded. The paper sets no lower bound: use ``eps_clip_low = 1`` (weight >= 0).
With ``tis_cap`` each L_t is also multiplied by the truncated rollout IS weight, and
``seq_ratio_bounds`` masks off-policy sequences, as in ``ppo``. There is no clipped
surrogate, so PPO's dual clip (``clip_ratio_c``) has nothing to bound: the validator
refuses it with this loss.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.policy_losses.terms import finish_policy_loss, policy_tokens
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
    t = policy_tokens(logprobs, old_logprobs, advantages, loss_weights, loss_mask, rollout_logprobs)
    ratio = torch.exp(t.log_ratio).detach()
    low, high = 1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high
    per_token = -ratio.clamp(low, high) * t.advantages * torch.where(t.mask, logprobs, 0.0)
    return finish_policy_loss(
        per_token, t, loss_weights, old_logprobs, rollout_logprobs, cfg,
        clip=(ratio < low) | (ratio > high),
    )  # fmt: skip
