"""The full per-micro-batch objective of each trainable role, from the algorithm's parts.

Policy: registered policy loss + ``kl_loss_coef`` x KL(policy || reference)
(when ``use_kl_loss``) - ``entropy_coef`` x entropy, each reduced with the
mini-batch ``loss_weights``. Critic: clipped value loss. Each returns the loss
tensor and a ``LossSums`` record: additive figures (the loss value, sums over
loss tokens, token counts), so adding the records of all micro batches and ranks
gives the mini-batch's exactly; ``skyrl.trainer.step_stats`` turns them into means.

The policy loss and the KL estimator are looked up by name in the worker's own registries,
which hold what the worker imported (``skyrl`` and ``cfg.imports``). The driver resolves the
names in its registries (``driver_parts``) and each policy worker registers the driver's
functions under those names first (``use_driver_parts``): one registered in a notebook or
script (``__main__``), or a built-in replaced with ``override=True`` there, is what validation
checked and what trains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from skyrl.algorithms import KL_ESTIMATORS, POLICY_LOSSES
from skyrl.algorithms.entropy import entropy_bonus
from skyrl.algorithms.kl import kl_loss
from skyrl.algorithms.value_loss import value_loss
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.registry import Registry
from skyrl.tracking import metric_names as names
from skyrl.workers.stats import LossSums

WORKER_PARTS: dict[str, Registry] = {"policy_loss": POLICY_LOSSES, "kl_estimator": KL_ESTIMATORS}
"""The ``algorithm`` keys whose registered function these losses look up by name."""


def driver_parts(cfg: AlgorithmConfig) -> dict[str, tuple[str, Callable]]:
    """``{key: (configured name, function)}`` for each of ``WORKER_PARTS``, as this process
    (the driver, where the config was validated) has them registered."""
    return {
        key: (getattr(cfg, key), reg.get(getattr(cfg, key))) for key, reg in WORKER_PARTS.items()
    }


def use_driver_parts(parts: dict[str, tuple[str, Callable]]) -> None:
    """Register the driver's functions (``driver_parts``) in this process under their names,
    over whatever is registered there (``override``): the driver's choice trains."""
    for key, (name, fn) in parts.items():
        WORKER_PARTS[key].register(name, override=True)(fn)


def policy_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    rows: TrainingInputBatch,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor, LossSums]:
    """The policy objective on rows ``[n, S]`` of one micro batch; ``LossSums.loss`` is the
    registered policy loss term alone (the KL and entropy terms have their token sums). A
    registered loss may return a constant for rows of no loss token (``_joined_to_graph``).
    ``LossSums.loss_tokens`` is counted here from ``loss_mask``, the tokens the KL and entropy
    sums run over, not taken from the loss's metrics: a loss may return none (``{}``)."""
    weights, mask = _field(rows, "loss_weights"), rows.loss_mask
    returned = POLICY_LOSSES.get(cfg.policy_loss)(
        logprobs, rows.old_logprobs, rows.advantages, weights, mask, cfg, rows.rollout_logprobs
    )
    loss, metrics = _loss_and_metrics(cfg.policy_loss, returned)
    if logprobs.requires_grad and not loss.requires_grad:
        loss = _joined_to_graph(cfg.policy_loss, loss, logprobs, mask)
    try:
        sums = LossSums.from_loss_metrics(float(loss.detach()), metrics)
    except ValueError as exc:  # a metric off the additive convention
        raise TypeError(f"algorithm.policy_loss={cfg.policy_loss}: {exc}") from None
    sums.loss_tokens = float((mask > 0).sum())
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


def _loss_and_metrics(name: str, returned: object) -> tuple[torch.Tensor, Mapping[str, float]]:
    """A registered policy loss's ``(loss, metrics)``: a one-element loss tensor and a mapping
    of additive metrics; anything else (the loss alone, a float, a per-row loss ``[N]``) is
    a ``TypeError`` naming ``algorithm.policy_loss`` and what the function returned."""
    if isinstance(returned, tuple | list) and len(returned) == 2:
        loss, metrics = returned
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and isinstance(metrics, Mapping):
            return loss, metrics
    raise TypeError(
        f"algorithm.policy_loss={name} returned {_describe(returned)}; a policy loss returns "
        "(loss, metrics): a scalar loss tensor and a dict of additive metrics "
        "(see recipes/custom_loss/loss.py)"
    )


def _joined_to_graph(
    name: str, loss: torch.Tensor, logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """A registered policy loss's ``loss`` that has no gradient, on rows of no loss token (a
    micro batch of a data-parallel padding row, of responses masked whole), e.g. a constant 0
    returned when there is nothing to train: the same value joined to the graph at zero, so
    its backward still reaches the parameters (DeepSpeed refuses a loss without a gradient,
    and every rank's backward must run its collectives). On rows with loss tokens it trains
    nothing: a ``TypeError`` naming ``algorithm.policy_loss``."""
    num_tokens = int((loss_mask > 0).sum())
    if num_tokens:
        raise TypeError(
            f"algorithm.policy_loss={name} returned a loss with no gradient on rows of "
            f"{num_tokens} loss tokens (computed without the logprobs, or detached): it would "
            "train nothing"
        )
    return logprobs.sum() * 0.0 + loss.to(logprobs.device, logprobs.dtype)


def _describe(value: object) -> str:
    """What a loss returned, in a few words: types and tensor shapes, never the values."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(item) for item in value) + ")"
    return f"a {type(value).__name__}"


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
