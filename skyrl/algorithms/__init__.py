"""Advantage estimators, policy losses, KL estimators and loss reductions, by name.

Importing this package registers every built-in, so ``algorithm.*`` names can be
validated against the registries. How the parts compose in one training step:

- ``compute_advantages(AdvantageInputs(...), cfg)`` (or, step-wise,
  ``broadcast_last_step_advantages``) once per batch;
- ``compute_loss_weights(cfg.loss_reduction, loss_mask, uids, max_seq_len)`` once
  per mini-batch, before DP padding and micro-batch packing;
- per micro batch: ``POLICY_LOSSES.get(cfg.policy_loss)(...)``, plus
  ``kl_loss_coef * kl_loss(...)`` when ``use_kl_loss``, minus
  ``entropy_coef * entropy_bonus(entropy_from_logits(...), ...)``; the critic uses
  ``value_loss``. Summing micro-batch losses gives the mini-batch loss exactly.
"""

from skyrl.algorithms.advantages import (
    AdvantageInputs,
    broadcast_last_step_advantages,
    compute_advantages,
    masked_whiten,
)
from skyrl.algorithms.entropy import entropy_bonus, entropy_from_logits
from skyrl.algorithms.kl import kl_loss, masked_kl
from skyrl.algorithms.kl_controllers import (
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
)
from skyrl.algorithms.policy_losses import finalize_metrics
from skyrl.algorithms.reductions import compute_loss_weights
from skyrl.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_REDUCTIONS,
    POLICY_LOSSES,
    Registry,
)
from skyrl.algorithms.value_loss import value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_REDUCTIONS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "FixedKLController",
    "Registry",
    "broadcast_last_step_advantages",
    "build_kl_controller",
    "compute_advantages",
    "compute_loss_weights",
    "entropy_bonus",
    "entropy_from_logits",
    "finalize_metrics",
    "kl_loss",
    "masked_kl",
    "masked_whiten",
    "value_loss",
]
