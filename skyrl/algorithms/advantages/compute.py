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
    result = estimator(inputs, cfg)
    expected = tuple(inputs.loss_mask.shape)
    if not (isinstance(result, tuple | list) and len(result) == 2):
        # unpacked as it is, a lone [2, S] tensor would give its two rows without an error
        got = (
            f"one tensor of shape {tuple(result.shape)}"
            if torch.is_tensor(result)
            else type(result).__name__
        )
        raise ValueError(
            f"estimator {cfg.advantage_estimator!r} must return (advantages, returns), "
            f"both of shape {expected}; it returned {got}"
        )
    advantages, returns = result
    for name, t in (("advantages", advantages), ("returns", returns)):
        if not torch.is_tensor(t) or tuple(t.shape) != expected:
            got = f"shape {tuple(t.shape)}" if torch.is_tensor(t) else type(t).__name__
            raise ValueError(
                f"estimator {cfg.advantage_estimator!r} returned {name} of {got}, expected {expected}"
            )
    if cfg.advantage_whitening:
        advantages = masked_whiten(advantages, inputs.loss_mask)
    mask = inputs.mask
    return torch.where(mask, advantages.float(), 0.0), torch.where(mask, returns.float(), 0.0)
