"""Name -> function registries for the parts of an RL algorithm.

A recipe adds its own part without touching ``skyrl/``::

    from skyrl.algorithms import POLICY_LOSSES

    @POLICY_LOSSES.register("my_loss")
    def my_loss(...): ...

and selects it with ``algorithm.policy_loss=my_loss`` (listing the recipe
module in the root ``imports`` key so the registration runs before validation).
``Registry`` itself lives in ``skyrl.registry``, shared with the metric sinks and the
engine backends; it is re-exported here for the recipes that import it from this module.
"""

from __future__ import annotations

from skyrl.registry import Registry

__all__ = ["ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_REDUCTIONS", "POLICY_LOSSES", "Registry"]

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")
POLICY_LOSSES: Registry = Registry("policy loss")
LOSS_REDUCTIONS: Registry = Registry("loss reduction")
KL_ESTIMATORS: Registry = Registry("KL estimator")
