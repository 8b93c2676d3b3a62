"""The full per-micro-batch objective of each trainable role, from the algorithm's parts.

Policy: registered policy loss + ``kl_loss_coef`` x KL(policy || reference)
(when ``use_kl_loss``) - ``entropy_coef`` x entropy, each reduced with the
mini-batch ``loss_weights``. Critic: clipped value loss. Each returns the loss
tensor and a ``LossSums`` record: additive figures (the loss value, sums over
loss tokens, token counts), so adding the records of all micro batches and ranks
gives the mini-batch's exactly; ``skyrl.trainer.step_stats`` turns them into means.
"""

from __future__ import annotations

import torch

from skyrl.algorithms import POLICY_LOSSES
from skyrl.algorithms.entropy import entropy_bonus
from skyrl.algorithms.kl import kl_loss
from skyrl.algorithms.value_loss import value_loss
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.tracking import metric_names as names
from skyrl.workers.stats import LossSums


def policy_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    rows: TrainingInputBatch,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, LossSums]:
    """The policy objective on rows ``[n, S]`` of one micro batch; ``LossSums.loss`` is the
    registered policy loss term alone (the KL and entropy terms have their token sums)."""
    weights, mask = _field(rows, "loss_weights"), rows.loss_mask
    loss, metrics = POLICY_LOSSES.get(cfg.policy_loss)(
        logprobs, rows.old_logprobs, rows.advantages, weights, mask, cfg, rows.rollout_logprobs
    )
    sums = LossSums.from_loss_metrics(float(loss.detach()), metrics)
    if cfg.use_kl_loss:
        kl_term, kl_metrics = kl_loss(
            cfg.kl_estimator, logprobs, _field(rows, "ref_logprobs"), weights, mask
        )
        loss = loss + cfg.kl_loss_coef * kl_term
        sums.token_sums[names.KL_TERM] = kl_metrics["kl_sum"]
    if entropy is not None:
        bonus = entropy_bonus(entropy, weights, mask)
        loss = loss - cfg.entropy_coef * bonus
        entropy_sum = float(torch.where(mask > 0, entropy.detach(), 0.0).sum())
        sums.token_sums[names.ENTROPY_TERM] = entropy_sum
    return loss, sums


def critic_loss(
    values: torch.Tensor, rows: TrainingInputBatch, cfg: AlgorithmConfig
) -> tuple[torch.Tensor, LossSums]:
    """The clipped value loss on rows ``[n, S]`` of one micro batch."""
    loss, metrics = value_loss(
        values,
        _field(rows, "values"),
        _field(rows, "returns"),
        _field(rows, "loss_weights"),
        rows.loss_mask,
        cfg.value_clip,
    )
    return loss, LossSums.from_loss_metrics(float(loss.detach()), metrics)


def _field(rows: TrainingInputBatch, name: str) -> torch.Tensor:
    """A field the loss cannot do without; an error naming it when the trainer did not add it."""
    tensor = rows.get(name)
    if tensor is None:
        raise ValueError(f"the training rows have no {name!r}: the trainer must add it first")
    return tensor
