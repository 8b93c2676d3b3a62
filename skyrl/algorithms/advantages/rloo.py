"""RLOO: REINFORCE with a leave-one-out baseline.

Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs", eq. 6: for the k samples of a prompt,

    A_i = r_i - 1/(k-1) * sum_{j != i} r_j,

given to every response token of sample i. A group of one sample has no other
samples to average, so its advantage is 0. With ``token_rewards`` (KL in reward)
the score is ``r_i + sum_t token_rewards``.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.advantages.groups import broadcast_to_tokens, group_index, group_sum_count
from skyrl.algorithms.advantages.inputs import AdvantageInputs
from skyrl.algorithms.registry import ADVANTAGE_ESTIMATORS
from skyrl.config.algorithm import AlgorithmConfig


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out mean baseline per prompt group; returns = advantages."""
    scores = inputs.sequence_rewards()
    sums, counts = group_sum_count(scores, group_index(inputs.uids, device=scores.device))
    baseline = (sums - scores) / (counts - 1).clamp(min=1)
    per_seq = torch.where(counts > 1, scores - baseline, 0.0).to(scores.dtype)  # float64 above
    adv = broadcast_to_tokens(per_seq, inputs.loss_mask)
    return adv, adv
