"""Policy losses: ``fn(logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg,
rollout_logprobs=None) -> (loss, metrics)`` over one micro batch ``[N, S]``. ``logprobs``
hold values at the loss tokens (``loss_mask`` != 0) only, 0 elsewhere: the workers run the
LM head only at the positions that predict a loss token (``skyrl.workers.logprobs``).

Importing this package registers the built-ins: ppo, gspo, cispo. Metrics are
additive token counts and sums (see ``terms``); ``finalize_metrics`` gives means.
"""

from skyrl.algorithms.policy_losses import cispo, gspo, ppo  # noqa: F401  (registers)
from skyrl.algorithms.policy_losses.terms import finalize_metrics, masked_log_ratio

__all__ = ["finalize_metrics", "masked_log_ratio"]
