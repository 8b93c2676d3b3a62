"""REINFORCE++ and REINFORCE++-baseline.

Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
Language Models". Token rewards are the per-token KL penalty
(``token_rewards = -beta * KL_t``, optional) plus the outcome reward on the last
response token; the advantage is the discounted return

    G_t = sum_{k >= t} gamma^(k - t) r_k,

normalised over the whole batch's response tokens (``A = (G - mean) / std``).

REINFORCE++-baseline (same paper, group-baseline variant): the sequence score
``r_i + sum_t token_rewards`` minus the mean score of its prompt group, given to
every token, then normalised over the batch the same way.

Departure: discounting steps over *loss* tokens only; non-trained tokens between
turns (env observations) pass the return through undiscounted and get 0.
Normalisation uses the unbiased std plus 1e-8.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.advantages.groups import (
    broadcast_to_tokens,
    group_index,
    group_mean_std,
    masked_whiten,
)
from skyrl.algorithms.advantages.inputs import AdvantageInputs
from skyrl.algorithms.registry import ADVANTAGE_ESTIMATORS
from skyrl.config.algorithm import AlgorithmConfig


def discounted_returns(
    token_rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """``[B, S]`` returns ``G_t = r_t + gamma * G_next`` over loss tokens, right to left; 0 off the mask."""
    mask = loss_mask > 0
    rewards = torch.where(mask, token_rewards, 0.0)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(mask[:, t], running, 0.0)
    return returns


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-normalised discounted returns; ``returns`` are the raw ``G_t``."""
    returns = discounted_returns(inputs.token_level_rewards(), inputs.loss_mask, cfg.gamma)
    return masked_whiten(returns, inputs.loss_mask), returns


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-mean baseline on the sequence score, then batch normalisation; returns = advantages."""
    scores = inputs.sequence_rewards()
    mean, _, _ = group_mean_std(scores, group_index(inputs.uids, device=scores.device))
    adv = masked_whiten(broadcast_to_tokens(scores - mean, inputs.loss_mask), inputs.loss_mask)
    return adv, adv
