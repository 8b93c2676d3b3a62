"""A policy loss registered from a recipe: the unclipped importance-weighted policy gradient.

Per token, with r_t = pi(y_t) / pi_old(y_t):

    L_t = -A_t * r_t

At r_t = 1 (the first optimizer step on fresh rollouts) its gradient is the
REINFORCE gradient -A_t * grad log pi(y_t), the same as PPO's; unlike PPO nothing
is clipped, so later mini-batches or epochs on the same rollouts can move the
policy arbitrarily far. The experiment therefore takes one optimizer step per
training step (``train_batch_size == policy_mini_batch_size``).

Importing this module registers it as ``vanilla_pg``; ``conf/experiment/custom_loss.yaml``
lists the module under ``imports`` and sets ``algorithm.policy_loss: vanilla_pg``.
It has the shared policy-loss signature and additive metrics (``skyrl/algorithms/
policy_losses/terms.py``); ``outside_clip_tokens`` counts the tokens PPO would clip (where
its clip binds: ``r_t > 1 + eps_clip_high`` with ``A_t > 0``, ``r_t < 1 - eps_clip_low`` with
``A_t < 0``), so ``policy/outside_clip_frac`` compares with PPO's ``policy/clip_frac``.
"""

from __future__ import annotations

import torch

from skyrl.algorithms import POLICY_LOSSES
from skyrl.algorithms.policy_losses.ppo import clipped_surrogate
from skyrl.algorithms.policy_losses.terms import finish_policy_loss, policy_tokens
from skyrl.config.algorithm import AlgorithmConfig

NAME = "vanilla_pg"
"""The name the loss is registered under (``algorithm.policy_loss``)."""


@POLICY_LOSSES.register(NAME)
def vanilla_pg(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_weights: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: AlgorithmConfig,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``sum_t w_t * (-A_t r_t)`` over loss tokens; metrics: outside_clip tokens (those PPO
    would clip), approx_kl_sum."""
    t = policy_tokens(logprobs, old_logprobs, advantages, loss_weights, loss_mask, rollout_logprobs)
    ratio = torch.exp(t.log_ratio)
    _, outside, _ = clipped_surrogate(ratio.detach(), t.advantages, cfg)
    return finish_policy_loss(
        -t.advantages * ratio, t, loss_weights, old_logprobs, rollout_logprobs, cfg,
        outside_clip=outside,
    )  # fmt: skip
