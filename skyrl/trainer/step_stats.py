"""The one place that reduces a training step's mini-batch records to logged metrics.

A step trains ``update_epochs_per_batch`` passes over its mini-batches; each mini-batch gives
one ``TrainStats`` (all ranks combined). ``step_metrics`` reduces them, all epochs together,
to the keys of ``skyrl.tracking.metric_names.TrainedRoleMetrics``:

- the loss and every token mean / flag fraction: the mean over mini-batches of each
  mini-batch's value, so they do not grow with the number of mini-batches (the previous
  reduction summed the loss over mini-batches and epochs);
- the grad norm: mean and max over the optimizer steps taken; the lr: the last step taken's
  (not a refused mini-batch's, which already reads the next step's);
- loss tokens, optimizer steps, refused steps and compute seconds: sums;
- packing: counts summed, the fill ratio recomputed from the totals, maxima as max.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import fmean

from skyrl.tracking.metric_names import TrainedRoleMetrics
from skyrl.workers.stats import PackingStats, TrainStats


def step_metrics(keys: TrainedRoleMetrics, records: Sequence[TrainStats]) -> dict[str, float]:
    """The step's metrics of one role from its mini-batch records, in training order ({} when
    the role did not train this step)."""
    if not records:
        return {}
    # a mini-batch without loss tokens (every response masked) has no loss to average in
    losses = [r.losses for r in records]
    scored = [s for s in losses if s.loss_tokens > 0] or losses
    grad_norms = [r.grad_norm for r in records if not r.nonfinite]
    out = {
        keys.loss: fmean(s.loss for s in scored),
        keys.grad_norm: fmean(grad_norms) if grad_norms else math.nan,
        keys.grad_norm_max: max(grad_norms) if grad_norms else math.nan,
        keys.lr: _last_step_lr(records),
        keys.loss_tokens: sum(s.loss_tokens for s in losses),
        keys.optimizer_steps: float(len(grad_norms)),
        keys.nonfinite: float(sum(r.nonfinite for r in records)),
        keys.compute_s: sum(r.compute_s for r in records),
    }
    for name in _names(s.token_sums for s in scored):
        out[keys.token_mean(name)] = fmean(s.token_mean(name) for s in scored)
    for name in _names(s.flag_tokens for s in scored):
        out[keys.token_frac(name)] = fmean(s.token_frac(name) for s in scored)
    out.update(_packing_metrics(keys, [r.packing for r in records]))
    return out


def _last_step_lr(records: Sequence[TrainStats]) -> float:
    """The lr of the last optimizer step taken. A refused mini-batch read the lr before its
    refused ``step()`` and the schedule did not move, so its lr is the one the next step will
    apply; when every mini-batch was refused, the last record's is all there is."""
    stepped = [r for r in records if not r.nonfinite]
    return (stepped or records)[-1].lr


def _packing_metrics(keys: TrainedRoleMetrics, packs: list[PackingStats]) -> dict[str, float]:
    step = PackingStats.combine(packs, max(p.rank_token_imbalance for p in packs))
    return {keys.pack(name): float(value) for name, value in dataclasses.asdict(step).items()}


def _names(dicts: Iterable[Mapping[str, float]]) -> list[str]:
    """The keys of any of ``dicts``, in first-seen order."""
    seen: dict[str, None] = {}
    for d in dicts:
        seen.update(dict.fromkeys(d))
    return list(seen)
