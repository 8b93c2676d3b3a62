"""GAE: generalized advantage estimation from a critic's values.

Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized
Advantage Estimation", eq. 16:

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lambda * A_{t+1}
    R_t     = A_t + V_t            (the value-loss target)

with V = 0 and A = 0 after the last response token. Token rewards are
``token_rewards`` (e.g. a KL penalty) plus the outcome reward on the last loss
token. The recursion runs over loss tokens only: a non-trained token between
turns is skipped (t+1 means the next *loss* token), and gets A = R = 0.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.advantages.inputs import AdvantageInputs
from skyrl.algorithms.registry import ADVANTAGE_ESTIMATORS
from skyrl.config.algorithm import AlgorithmConfig


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token GAE advantages and returns; needs ``inputs.values``."""
    if inputs.values is None:
        raise ValueError("advantage estimator 'gae' needs inputs.values from a critic")
    mask = inputs.mask
    rewards = inputs.token_level_rewards()
    values = torch.where(mask, inputs.values.to(torch.float32), 0.0)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + cfg.gamma * next_value - values[:, t]
        adv_t = delta + cfg.gamma * cfg.lambd * next_adv
        on = mask[:, t]
        advantages[:, t] = torch.where(on, adv_t, 0.0)
        next_adv = torch.where(on, adv_t, next_adv)
        next_value = torch.where(on, values[:, t], next_value)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns
