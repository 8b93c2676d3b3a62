"""``compute_advantages``: the registered estimator, optional whitening, masking."""

from __future__ import annotations

import torch

from skyrl.algorithms.advantages.groups import masked_whiten
from skyrl.algorithms.advantages.inputs import AdvantageInputs
from skyrl.algorithms.registry import ADVANTAGE_ESTIMATORS
from skyrl.config.algorithm import AlgorithmConfig


def compute_advantages(
    inputs: AdvantageInputs, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, both ``[B, S]`` float32 and exactly 0 off ``loss_mask``.

    Runs ``cfg.advantage_estimator``; with ``cfg.advantage_whitening`` the advantages
    are then whitened over all loss tokens of the batch (returns are left as they are).
    """
    estimator = ADVANTAGE_ESTIMATORS.get(cfg.advantage_estimator)
    advantages, returns = estimator(inputs, cfg)
    expected = tuple(inputs.loss_mask.shape)
    for name, t in (("advantages", advantages), ("returns", returns)):
        if tuple(t.shape) != expected:
            raise ValueError(
                f"estimator {cfg.advantage_estimator!r} returned {name} of shape {tuple(t.shape)}, expected {expected}"
            )
    if cfg.advantage_whitening:
        advantages = masked_whiten(advantages, inputs.loss_mask)
    mask = inputs.mask
    return torch.where(mask, advantages.float(), 0.0), torch.where(mask, returns.float(), 0.0)
