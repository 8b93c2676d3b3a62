"""GSPO: the PPO clip applied to a sequence-level importance ratio.

Zheng et al. 2025, "Group Sequence Policy Optimization", eq. 7 and the
GSPO-token form (eq. 13): the ratio of sequence i is the geometric mean of its
token ratios over its |y_i| loss tokens,

    s_i = exp( (1/|y_i|) sum_t log(pi(y_t) / pi_old(y_t)) ),

and each token uses ``s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` (value s_i; the
gradient of log pi(y_t)) in the clipped surrogate of ``ppo`` (same eps_low /
eps_high, dual clip, TIS, sequence mask). Every token of a sequence is clipped together.
With per-sequence advantages and ``loss_reduction=sequence_mean`` (the preset's: weights
1/(|y_i| G)) this equals the gradient of the sequence-level GSPO objective, the mean over
the G sequences. Another reduction weighs sequence i by its tokens' total weight instead
of 1/G (``token_mean``: |y_i| / all loss tokens, favouring long sequences).
A sequence is never split across micro batches, so |y_i| is the row's count.
The paper's clip ranges are small (3e-4 / 4e-4) because s_i is a per-token mean.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.policy_losses.ppo import clipped_surrogate
from skyrl.algorithms.policy_losses.terms import finish_policy_loss, policy_tokens
from skyrl.algorithms.registry import POLICY_LOSSES
from skyrl.config.algorithm import AlgorithmConfig


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N]`` mean token log-ratio per row over its loss tokens (0 for a row with none)."""
    return torch.where(mask, log_ratio, 0.0).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


@POLICY_LOSSES.register("gspo")
def gspo(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_weights: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence-ratio clipped surrogate; metrics as ``ppo`` (clip counted per token)."""
    t = policy_tokens(logprobs, old_logprobs, advantages, loss_weights, loss_mask, rollout_logprobs)
    seq_log_ratio = sequence_log_ratio(t.log_ratio, t.mask).detach().unsqueeze(1)
    token_log_ratio = t.log_ratio - t.log_ratio.detach() + seq_log_ratio
    per_token, clipped, dual_clipped = clipped_surrogate(
        torch.exp(token_log_ratio), t.advantages, cfg
    )
    return finish_policy_loss(
        per_token, t, loss_weights, old_logprobs, rollout_logprobs, cfg,
        clip=clipped, dual_clip=dual_clipped,
    )  # fmt: skip
