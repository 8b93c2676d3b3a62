"""What one optimizer step on one mini-batch reports, as typed records.

A worker's ``train_mini_batch`` returns a ``TrainStats`` for its chunk; ``combine_ranks``
merges the dp ranks' records into the mini-batch's record (loss sums add, grad norm and lr
are the same on every rank, compute seconds take the slowest rank); the trainer hands the
step's records to ``skyrl.trainer.step_stats``, the one place that reduces them to logged
metrics (names, units and reductions in ``skyrl.tracking.metric_names``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class LossSums:
    """Additive figures of a loss over some loss tokens: one micro batch, one rank's chunk or
    one whole mini-batch. Adding the records of disjoint token sets gives those of their union
    exactly, so micro batches and ranks add up to the mini-batch."""

    loss: float = 0.0
    """``sum_t w_t L_t`` with the mini-batch ``loss_weights``: the registered policy loss (or
    the value loss) term, without the KL and entropy terms. The weights are normalised over
    the whole mini-batch, so the sum over its micro batches and ranks IS the mini-batch loss
    (its token mean under ``loss_reduction=token_mean``)."""
    loss_tokens: float = 0.0
    """Tokens with ``loss_mask`` on."""
    token_sums: dict[str, float] = field(default_factory=dict)
    """``name -> sum over loss tokens`` (a loss's ``<name>_sum``): ``approx_kl``, ``kl``,
    ``entropy``, ``value_error``, ..."""
    flag_tokens: dict[str, float] = field(default_factory=dict)
    """``name -> loss tokens where the flag is on`` (a loss's ``<name>_tokens``): ``clip``,
    ``dual_clip``, ``tis_clip``, ``seq_masked``, ``vf_clip``, ..."""

    @classmethod
    def from_loss_metrics(cls, loss: float, metrics: Mapping[str, float]) -> LossSums:
        """From a registered loss's ``(loss, metrics)``; ``metrics`` follow the convention of
        ``skyrl/algorithms/policy_losses/terms.py``: ``loss_tokens``, ``<name>_tokens``
        (flag counts) and ``<name>_sum`` (sums over loss tokens), each one number; anything
        else is a ``ValueError`` naming the metric."""
        sums = cls(loss=loss)
        for key, value in metrics.items():
            if key == "loss_tokens":
                sums.loss_tokens = _number(key, value)
            elif key.endswith("_tokens"):
                sums.flag_tokens[key.removesuffix("_tokens")] = _number(key, value)
            elif key.endswith("_sum"):
                sums.token_sums[key.removesuffix("_sum")] = _number(key, value)
            else:
                raise ValueError(
                    f"loss metric {key!r} is neither a token count (<name>_tokens) nor a sum "
                    "over loss tokens (<name>_sum); see skyrl/algorithms/policy_losses/terms.py"
                )
        return sums

    def __add__(self, other: LossSums) -> LossSums:
        return LossSums(
            loss=self.loss + other.loss,
            loss_tokens=self.loss_tokens + other.loss_tokens,
            token_sums=_add_dicts(self.token_sums, other.token_sums),
            flag_tokens=_add_dicts(self.flag_tokens, other.flag_tokens),
        )

    def token_mean(self, name: str) -> float:
        """``token_sums[name]`` per loss token (0 without loss tokens)."""
        return self.token_sums.get(name, 0.0) / max(self.loss_tokens, 1.0)

    def token_frac(self, name: str) -> float:
        """Share of loss tokens where flag ``name`` is on (0 without loss tokens)."""
        return self.flag_tokens.get(name, 0.0) / max(self.loss_tokens, 1.0)


@dataclass
class PackingStats:
    """How one mini-batch was packed into token-budget micro batches (the fields of
    ``skyrl.batch.packing.micro_batch_metrics``). Per rank, then summed over ranks and over
    the step's mini-batches, except where a field says otherwise."""

    local_tokens: float
    """Tokens the model computed: real (non-padding) tokens, a prompt shared by several rows
    of a micro batch counted once."""
    local_loss_tokens: float
    """Loss tokens packed."""
    local_samples: float
    """Sequences packed."""
    local_micro_batches: float
    """Micro batches run, zero-loss fillers included."""
    max_micro_batch_tokens: float
    """Tokens of the fullest micro batch: max over ranks and mini-batches."""
    micro_batch_max_tokens: float
    """The token budget per micro batch; combined, the mean budget of the micro batches run
    (the budget itself when every rank has the same; GPU ranks size theirs from their own
    free memory)."""
    fill_ratio: float
    """``local_tokens / capacity_tokens``: the share of the micro batches' capacity that real
    tokens filled (at most 1), recomputed from the totals whenever records are combined."""
    oversized_sequences: float
    """Sequences longer than the budget (each packed alone)."""
    shared_prefix_tokens: float = 0.0
    """Tokens not computed because rows of a micro batch shared their prompt
    (``trainer.share_prompts``): the rows' own real tokens are ``local_tokens`` plus these."""
    rank_token_imbalance: float = 1.0
    """Tokens the busiest rank computed / those the least busy one computed (data-parallel
    padding rows included: a rank computes them as it does data): per mini-batch over its
    ranks; the step reports the max over its mini-batches."""
    padding_tokens: float = 0.0
    """Tokens of the zero-loss rows that pad a mini-batch to the data-parallel size: computed,
    but not in ``local_tokens``."""
    capacity_tokens: float = 0.0
    """Tokens the micro batches run could hold: each one's budget, or its tokens when it holds a
    sequence longer than the budget (packed alone: it is full). 0 in a record that does not
    give it: its micro batches' budgets, ``local_micro_batches x micro_batch_max_tokens``."""

    @staticmethod
    def combine(parts: Sequence[PackingStats], rank_token_imbalance: float) -> PackingStats:
        """The record of several disjoint parts (ranks of a mini-batch, mini-batches of a step)."""
        tokens = sum(p.local_tokens for p in parts)
        micro = sum(p.local_micro_batches for p in parts)
        budgets = sum(p.local_micro_batches * p.micro_batch_max_tokens for p in parts)
        capacity = sum(
            p.capacity_tokens or p.local_micro_batches * p.micro_batch_max_tokens for p in parts
        )
        cap = budgets / micro if micro else parts[0].micro_batch_max_tokens
        return PackingStats(
            local_tokens=tokens,
            local_loss_tokens=sum(p.local_loss_tokens for p in parts),
            local_samples=sum(p.local_samples for p in parts),
            local_micro_batches=micro,
            max_micro_batch_tokens=max(p.max_micro_batch_tokens for p in parts),
            micro_batch_max_tokens=cap,
            fill_ratio=tokens / capacity if capacity else 0.0,
            oversized_sequences=sum(p.oversized_sequences for p in parts),
            shared_prefix_tokens=sum(p.shared_prefix_tokens for p in parts),
            rank_token_imbalance=rank_token_imbalance,
            padding_tokens=sum(p.padding_tokens for p in parts),
            capacity_tokens=capacity,
        )


@dataclass
class TrainStats:
    """One optimizer step on one mini-batch: a rank's chunk, or (``combine_ranks``) all ranks."""

    losses: LossSums
    grad_norm: float
    """Global L2 norm of the mini-batch gradient before clipping; NaN when refused."""
    lr: float
    """Learning rate the optimizer step applied (read before the scheduler moved on)."""
    nonfinite: bool
    """The step was refused: a non-finite loss or gradient on some rank, no optimizer step."""
    compute_s: float
    """Seconds of forward, backward and optimizer step on this rank (slowest rank combined)."""
    packing: PackingStats
    logprobs: torch.Tensor | None = None
    """On-policy steps (``old_logprobs_from_training``): the training forward's logprobs of
    this rank's chunk rows ``[rows, S]``, detached: the step's old logprobs. Not combined:
    ``WorkerGroup.train_mini_batch`` puts them back in batch order first."""
    source_rows: list[int] | None = None
    """With ``logprobs``: each chunk row's row in the staged batch (-1 = padding)."""


def combine_ranks(per_rank: Sequence[TrainStats]) -> TrainStats:
    """The mini-batch's record from its ranks': loss sums and packing counts add, grad norm and
    lr are the same on every rank (rank 0's), refused if any rank refused, slowest rank's
    compute seconds, rank token imbalance = busiest / least busy rank's computed tokens, its
    padding rows' included (1.0 when no rank has any, as
    ``skyrl.dispatch.mesh.token_imbalance``, which balanced them so)."""
    tokens = [r.packing.local_tokens + r.packing.padding_tokens for r in per_rank]
    losses = LossSums()
    for record in per_rank:
        losses = losses + record.losses
    return TrainStats(
        losses=losses,
        grad_norm=per_rank[0].grad_norm,
        lr=per_rank[0].lr,
        nonfinite=any(r.nonfinite for r in per_rank),
        compute_s=max(r.compute_s for r in per_rank),
        packing=PackingStats.combine(
            [r.packing for r in per_rank],
            max(tokens) / max(min(tokens), 1.0) if max(tokens) else 1.0,
        ),
    )


def _number(key: str, value: object) -> float:
    """A loss metric's value as a float; a ``ValueError`` naming ``key`` when it is not one
    number (a per-row tensor, a list, None)."""
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise ValueError(
            f"loss metric {key!r} is a tensor of shape {list(value.shape)}, not a number"
        )
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"loss metric {key!r} is a {type(value).__name__}, not a number") from None


def _add_dicts(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return {key: a.get(key, 0.0) + b.get(key, 0.0) for key in {**a, **b}}
