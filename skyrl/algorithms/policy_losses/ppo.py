"""PPO clipped surrogate, with DAPO clip-higher, dual clip and optional TIS.

PPO (Schulman et al. 2017, eq. 7), per token with r_t = pi(y_t) / pi_old(y_t):

    L_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)

Separate ``eps_clip_low`` / ``eps_clip_high`` are DAPO's clip-higher (Yu et al. 2025,
eq. 10; 0.2 / 0.28). Dual clip (Ye et al. 2020, "Mastering Complex Control in
MOBA Games with Deep RL") bounds the loss of negative-advantage tokens whose
ratio exploded: for A_t < 0, ``L_t = min(L_t, -c A_t)`` with c = ``clip_ratio_c``.
With ``tis_cap`` each L_t is multiplied by ``min(pi_old / pi_rollout, tis_cap)``; with
``seq_ratio_bounds`` a sequence too far off the rollout policy gets no loss (``terms``).
The reduction is the mini-batch weights: ``loss = sum_t w_t L_t``.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.policy_losses.terms import finish_policy_loss, policy_tokens
from skyrl.algorithms.registry import POLICY_LOSSES
from skyrl.config.algorithm import AlgorithmConfig


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token ``(loss, clipped, dual_clipped)`` of the PPO objective for given ratios."""
    surr_unclipped = -advantages * ratio
    surr_clipped = -advantages * ratio.clamp(1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high)
    loss = torch.maximum(surr_unclipped, surr_clipped)
    clipped = surr_clipped > surr_unclipped
    dual_clipped = torch.zeros_like(clipped)
    if cfg.clip_ratio_c is not None:
        bound = -advantages * cfg.clip_ratio_c
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_clipped, bound, loss)
    return loss, clipped, dual_clipped


@POLICY_LOSSES.register("ppo")
def ppo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_weights: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate; metrics: clip/dual_clip/tis_clip/seq_masked tokens, approx_kl_sum."""
    t = policy_tokens(logprobs, old_logprobs, advantages, loss_weights, loss_mask, rollout_logprobs)
    per_token, clipped, dual_clipped = clipped_surrogate(torch.exp(t.log_ratio), t.advantages, cfg)
    return finish_policy_loss(
        per_token, t, loss_weights, old_logprobs, rollout_logprobs, cfg,
        clip=clipped, dual_clip=dual_clipped,
    )  # fmt: skip
