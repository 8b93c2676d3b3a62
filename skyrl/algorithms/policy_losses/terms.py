"""Pieces every policy loss shares: input checks, the masked log-ratio, the off-policy
corrections (TIS, the sequence mask), the weighted sum, metrics.

A loss is ``policy_tokens`` (checks, mask, log-ratio, masked advantages), its own
per-token formula, then ``finish_policy_loss`` (TIS, sequence mask, weighted sum, metrics).

A loss sees one micro batch as rows ``[N, S]``: the worker unpacks its packed
``[1, T]`` forward output back to one row per training sequence before calling it, so
a row is a sequence. ``sequence_ids`` also splits a packed row by its position ids.

Metrics convention: every value a loss returns is *additive*: a count of loss
tokens (``loss_tokens``, ``<name>_tokens``) or a sum over loss tokens
(``<name>_sum``), nothing else. The worker reads them into a typed
``skyrl.workers.stats.LossSums`` (which refuses any other key); summing those of all
micro batches and DP ranks gives the mini-batch totals exactly, and
``skyrl.trainer.step_stats`` reports ``clip_tokens`` as ``clip_frac`` and
``approx_kl_sum`` as ``approx_kl`` (token means). ``finalize_metrics`` is the same
mapping on one dict of sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skyrl.algorithms.shapes import check_same_shape
from skyrl.config.algorithm import AlgorithmConfig

LOG_RATIO_CLAMP = 20.0
"""|log pi/pi_old| is clamped to this before exp (numerical guard, as in verl)."""


def check_policy_inputs(**tensors: torch.Tensor | None) -> None:
    """All token tensors ``[N, S]`` alike; raises with every shape otherwise."""
    check_same_shape(**tensors)


def masked_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``log pi - log pi_old`` on loss tokens (clamped to +-20), exactly 0 elsewhere (NaN-safe)."""
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0)
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def tis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    cfg: AlgorithmConfig,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Truncated importance sampling ``min(pi_old / pi_rollout, tis_cap)`` (no gradient), or None when off.

    Corrects the mismatch between the inference engine's sampler and the trainer
    (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").
    """
    if cfg.tis_cap is None:
        return None, {}
    if rollout_logprobs is None:
        raise ValueError(
            "algorithm.tis_cap is set but no rollout_logprobs were given to the policy loss"
        )
    ratio = torch.exp(masked_log_ratio(old_logprobs, rollout_logprobs, mask)).detach()
    capped = mask & (ratio > cfg.tis_cap)
    return torch.where(mask, ratio.clamp(max=cfg.tis_cap), 1.0), {
        "tis_clip_tokens": float(capped.sum())
    }


def sequence_ids(mask: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, S]`` long: the training sequence of each token, unique over the micro batch.

    Without ``position_ids`` each row is one sequence (its row index). With them (``[N, S]``,
    as ``skyrl.batch.packing`` builds them) a packed row holds several: a new id begins at
    the row's first token and wherever a position is not the previous one + 1. That is a
    restart at 0 (a new sequence) or, with shared prompts, a jump back to the prompt's
    length (another row's continuation of a prompt packed once), as
    ``skyrl.workers.packed_attention.attention_spans`` reads them.
    """
    n, s = mask.shape
    rows = torch.arange(n, device=mask.device).unsqueeze(1)
    if position_ids is None:
        return rows.expand(n, s)
    starts = torch.ones_like(position_ids, dtype=torch.long)
    starts[:, 1:] = (position_ids[:, 1:] != position_ids[:, :-1] + 1).long()
    return rows * (s + 1) + starts.cumsum(dim=1)


def seq_ratio_mask(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    cfg: AlgorithmConfig,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """``[N, S]`` bool, False on every token of a sequence whose geometric-mean ratio
    ``exp(mean over its loss tokens of (log pi_old - log pi_rollout))`` lies outside
    ``cfg.seq_ratio_bounds``; or None when off. Metric ``seq_masked_tokens``: loss tokens masked.

    The sequence-level counterpart of ``tis_weights`` for stale or mismatched rollouts: a
    sequence too far off-policy is dropped whole rather than reweighted token by token.
    Sequences are rows, or the spans ``sequence_ids`` finds from ``position_ids``.
    """
    if cfg.seq_ratio_bounds is None:
        return None, {}
    if rollout_logprobs is None:
        raise ValueError(
            "algorithm.seq_ratio_bounds is set but no rollout_logprobs were given to the policy loss"
        )
    log_ratio = masked_log_ratio(old_logprobs, rollout_logprobs, mask).detach().reshape(-1)
    ids = sequence_ids(mask, position_ids).reshape(-1)
    num_ids = int(ids.max()) + 1 if ids.numel() else 0
    sums = log_ratio.new_zeros(num_ids).index_add_(0, ids, log_ratio)
    counts = log_ratio.new_zeros(num_ids).index_add_(0, ids, mask.reshape(-1).to(log_ratio.dtype))
    seq_ratio = torch.exp(sums / counts.clamp(min=1))
    low, high = cfg.seq_ratio_bounds
    keep = ((seq_ratio >= low) & (seq_ratio <= high))[ids].reshape(mask.shape)
    return keep, {"seq_masked_tokens": float((mask & ~keep).sum())}


def weighted_sum(
    per_token_loss: torch.Tensor, loss_weights: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``sum(per_token_loss * loss_weights)`` over loss tokens; 0 (not NaN) when nothing is masked in."""
    return torch.where(mask, per_token_loss * loss_weights, 0.0).sum()


def token_counts(mask: torch.Tensor, **flags: torch.Tensor) -> dict[str, float]:
    """``{"loss_tokens": n, "<name>_tokens": count of flag on loss tokens, ...}``."""
    out = {"loss_tokens": float(mask.sum())}
    for name, flag in flags.items():
        out[f"{name}_tokens"] = float((flag & mask).sum())
    return out


def token_sums(mask: torch.Tensor, **values: torch.Tensor) -> dict[str, float]:
    """``{"<name>_sum": sum of value over loss tokens, ...}`` (no gradient)."""
    return {
        f"{name}_sum": float(torch.where(mask, v.detach(), 0.0).sum()) for name, v in values.items()
    }


def approx_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi_old || pi) per token: ``(r - 1) - log r`` with ``r = pi / pi_old``."""
    return torch.expm1(log_ratio) - log_ratio


def finalize_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Token means from additive sums: ``x_tokens -> x_frac``, ``x_sum -> x``; other keys kept."""
    n = max(sums.get("loss_tokens", 0.0), 1.0)
    out: dict[str, float] = {}
    for key, value in sums.items():
        if key.endswith("_tokens") and key != "loss_tokens":
            out[key.removesuffix("_tokens") + "_frac"] = value / n
        elif key.endswith("_sum"):
            out[key.removesuffix("_sum")] = value / n
        else:
            out[key] = value
    return out


@dataclass
class PolicyTokens:
    """The per-token inputs every policy loss starts from, all ``[N, S]``."""

    mask: torch.Tensor
    """True on loss tokens."""
    log_ratio: torch.Tensor
    """``log pi - log pi_old`` on loss tokens (clamped), 0 elsewhere."""
    advantages: torch.Tensor
    """Advantages on loss tokens, 0 elsewhere."""


def policy_tokens(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_weights: torch.Tensor,
    loss_mask: torch.Tensor,
    rollout_logprobs: torch.Tensor | None = None,
) -> PolicyTokens:
    """Check the shapes of a policy loss's arguments and build its masked per-token inputs."""
    check_policy_inputs(
        logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
        loss_weights=loss_weights, loss_mask=loss_mask, rollout_logprobs=rollout_logprobs,
    )  # fmt: skip
    mask = loss_mask > 0
    return PolicyTokens(
        mask, masked_log_ratio(logprobs, old_logprobs, mask), torch.where(mask, advantages, 0.0)
    )


def finish_policy_loss(
    per_token_loss: torch.Tensor,
    tokens: PolicyTokens,
    loss_weights: torch.Tensor,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
    cfg: AlgorithmConfig,
    **flags: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """TIS (if ``cfg.tis_cap``) and the sequence mask (if ``cfg.seq_ratio_bounds``), then
    ``(sum_t w_t L_t, metrics)``: loss tokens, the count of each flag as ``<name>_tokens``,
    ``approx_kl_sum``, TIS's clipped tokens and the sequence mask's masked tokens."""
    tis, tis_metrics = tis_weights(old_logprobs, rollout_logprobs, tokens.mask, cfg)
    if tis is not None:
        per_token_loss = per_token_loss * tis
    keep, seq_metrics = seq_ratio_mask(old_logprobs, rollout_logprobs, tokens.mask, cfg)
    if keep is not None:
        per_token_loss = torch.where(keep, per_token_loss, 0.0)
    metrics = token_counts(tokens.mask, **flags)
    metrics.update(token_sums(tokens.mask, approx_kl=approx_kl(tokens.log_ratio)))
    metrics.update(tis_metrics, **seq_metrics)
    return weighted_sum(per_token_loss, loss_weights, tokens.mask), metrics
