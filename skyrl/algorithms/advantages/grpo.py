"""GRPO and Dr.GRPO outcome advantages: the group-mean baseline.

GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 with outcome supervision): for the
G samples of one prompt with rewards r_1..r_G,

    A_i = (r_i - mean(r)) / (std(r) + eps),     eps = 1e-6,

given to every response token of sample i. ``norm_adv_by_std=false`` drops the
division. Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") drops
it always (``A_i = r_i - mean(r)``) and pairs with the constant-length reduction
``seq_mean_token_sum_norm``.

Departures: std is the unbiased sample std (as ``torch.std``, like verl/TRL);
a group of one sample gets advantage 0 (no relative signal), not its raw reward.
With ``token_rewards`` (KL in reward) the score is ``r_i + sum_t token_rewards``.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.advantages.groups import broadcast_to_tokens, group_index, group_mean_std
from skyrl.algorithms.advantages.inputs import AdvantageInputs
from skyrl.algorithms.registry import ADVANTAGE_ESTIMATORS
from skyrl.config.algorithm import AlgorithmConfig

GRPO_STD_EPS = 1e-6
"""Added to the group std before dividing."""


def group_relative(scores: torch.Tensor, uids: list[str], norm_by_std: bool) -> torch.Tensor:
    """``[B]``: ``score - group mean``, divided by ``group std + 1e-6`` when ``norm_by_std``."""
    mean, std, _ = group_mean_std(scores, group_index(uids, device=scores.device))
    centered = scores - mean  # float64 (group_mean_std): equal scores centre to exactly 0
    return (centered / (std + GRPO_STD_EPS) if norm_by_std else centered).to(scores.dtype)


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: group-mean baseline, std-normalised when ``cfg.norm_adv_by_std``; returns = advantages."""
    adv = broadcast_to_tokens(
        group_relative(inputs.sequence_rewards(), inputs.uids, cfg.norm_adv_by_std),
        inputs.loss_mask,
    )
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr.GRPO: group-mean baseline, never std-normalised; returns = advantages."""
    adv = broadcast_to_tokens(
        group_relative(inputs.sequence_rewards(), inputs.uids, norm_by_std=False), inputs.loss_mask
    )
    return adv, adv
