"""Advantage estimators, policy losses, KL estimators and loss reductions, by name."""

from skyrl.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_REDUCTIONS,
    POLICY_LOSSES,
    Registry,
)

__all__ = ["ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_REDUCTIONS", "POLICY_LOSSES", "Registry"]
