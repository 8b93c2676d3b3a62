"""The full per-micro-batch objective of each trainable role, from the algorithm's parts.

Policy: registered policy loss + ``kl_loss_coef`` x KL(policy || reference)
(when ``use_kl_loss``) - ``entropy_coef`` x entropy, each reduced with the
mini-batch ``loss_weights``. Critic: clipped value loss. Every metric returned
is additive (sums and token counts), so summing over micro batches and ranks
gives the mini-batch totals; ``finalize_metrics`` turns them into means.
"""

from __future__ import annotations

import torch

from skyrl.algorithms import POLICY_LOSSES
from skyrl.algorithms.entropy import entropy_bonus
from skyrl.algorithms.kl import kl_loss
from skyrl.algorithms.value_loss import value_loss
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig


def policy_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    rows: TrainingInputBatch,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy objective on rows ``[n, S]`` of one micro batch."""
    weights, mask = rows.loss_weights, rows.loss_mask
    loss, metrics = POLICY_LOSSES.get(cfg.policy_loss)(
        logprobs, rows.old_logprobs, rows.advantages, weights, mask, cfg, rows.rollout_logprobs
    )
    metrics["policy_loss"] = float(loss.detach())
    if cfg.use_kl_loss:
        kl_term, kl_metrics = kl_loss(cfg.kl_estimator, logprobs, rows.ref_logprobs, weights, mask)
        loss = loss + cfg.kl_loss_coef * kl_term
        metrics["kl_sum"] = kl_metrics["kl_sum"]
    if entropy is not None:
        bonus = entropy_bonus(entropy, weights, mask)
        loss = loss - cfg.entropy_coef * bonus
        metrics["entropy_sum"] = float(torch.where(mask > 0, entropy.detach(), 0.0).sum())
    return loss, metrics


def critic_loss(
    values: torch.Tensor, rows: TrainingInputBatch, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped value loss on rows ``[n, S]`` of one micro batch."""
    loss, metrics = value_loss(
        values, rows.values, rows.returns, rows.loss_weights, rows.loss_mask, cfg.value_clip
    )
    metrics["critic_loss"] = float(loss.detach())
    return loss, metrics
