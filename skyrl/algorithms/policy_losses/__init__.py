"""Policy losses: ``fn(logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg,
rollout_logprobs=None) -> (loss, metrics)`` over one micro batch ``[N, S]``.

Importing this package registers the built-ins: ppo, gspo, cispo. Metrics are
additive token counts and sums (see ``terms``); ``finalize_metrics`` gives means.
"""

from skyrl.algorithms.policy_losses import cispo, gspo, ppo  # noqa: F401  (registers)
from skyrl.algorithms.policy_losses.terms import finalize_metrics, masked_log_ratio

__all__ = ["finalize_metrics", "masked_log_ratio"]
