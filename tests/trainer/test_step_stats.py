"""The step reducer (skyrl/trainer/step_stats.py) and the rank combine (skyrl/workers/stats.py),
on hand-made records with hand-derived values."""

from __future__ import annotations

import math

import pytest

from skyrl.tracking import metric_names as names
from skyrl.trainer.step_stats import step_metrics
from skyrl.workers.stats import LossSums, PackingStats, TrainStats, combine_ranks

POLICY, CRITIC = names.POLICY, names.CRITIC


def packing(tokens: float, micro: float, max_mb: float = 8.0, imbalance: float = 1.0):
    return PackingStats(
        local_tokens=tokens, local_loss_tokens=tokens / 2, local_samples=2.0,
        local_micro_batches=micro, max_micro_batch_tokens=max_mb, micro_batch_max_tokens=16.0,
        fill_ratio=tokens / (micro * 16.0), oversized_sequences=0.0,
        rank_token_imbalance=imbalance,
    )  # fmt: skip


def record(
    loss: float,
    loss_tokens: float,
    *,
    kl_sum: float = 0.0,
    clip_tokens: float = 0.0,
    grad_norm: float = 1.0,
    lr: float = 1e-3,
    nonfinite: bool = False,
    compute_s: float = 1.0,
    pack: PackingStats | None = None,
) -> TrainStats:
    losses = LossSums(loss, loss_tokens, {names.KL_TERM: kl_sum}, {"clip": clip_tokens})
    return TrainStats(losses, grad_norm, lr, nonfinite, compute_s, pack or packing(10.0, 1.0))


def test_two_mini_batches_are_averaged_not_summed():
    # mini-batch losses 0.75 and 0.25 (each already the mini-batch's token mean under
    # token_mean weights): the mean is (0.75 + 0.25) / 2 = 0.5; the old reduction summed to 1.0.
    # KL sums 3.0 over 6 tokens and 1.0 over 2 tokens: token means 0.5 and 0.5 -> 0.5
    # (pooled it would be 4 / 8 = 0.5 too; see the next test for where they differ).
    # clip tokens 3 of 6 and 0 of 2: fractions 0.5 and 0 -> 0.25.
    # grad norms 1 and 3: mean 2, max 3; lr is the second's; compute 1.5 + 2.5 = 4 s.
    records = [
        record(0.75, 6, kl_sum=3.0, clip_tokens=3, grad_norm=1.0, lr=1e-3, compute_s=1.5),
        record(0.25, 2, kl_sum=1.0, clip_tokens=0, grad_norm=3.0, lr=2e-3, compute_s=2.5),
    ]
    metrics = step_metrics(POLICY, records)
    assert metrics[POLICY.loss] == pytest.approx(0.5, abs=1e-12)
    assert metrics[names.KL] == pytest.approx(0.5, abs=1e-12)
    assert metrics[POLICY.token_frac("clip")] == pytest.approx(0.25, abs=1e-12)
    assert metrics[POLICY.grad_norm] == pytest.approx(2.0, abs=1e-12)
    assert metrics[POLICY.grad_norm_max] == 3.0
    assert metrics[POLICY.lr] == 2e-3
    assert metrics[POLICY.loss_tokens] == 8.0
    assert metrics[POLICY.optimizer_steps] == 2.0
    assert metrics[POLICY.nonfinite] == 0.0
    assert metrics[POLICY.compute_s] == pytest.approx(4.0, abs=1e-12)


def test_token_means_are_means_over_mini_batches():
    # KL 2.0 over 2 tokens (mean 1.0) and 0.0 over 8 tokens (mean 0.0): (1 + 0) / 2 = 0.5,
    # not the pooled 2 / 10 = 0.2: every mini-batch (optimizer step) weighs the same.
    records = [record(0.1, 2, kl_sum=2.0), record(0.1, 8, kl_sum=0.0)]
    assert step_metrics(POLICY, records)[names.KL] == pytest.approx(0.5, abs=1e-12)


def test_refused_mini_batches_are_counted_and_leave_the_grad_norm_alone():
    # the refused one has no grad norm (NaN): mean and max over the 2 steps taken, 1 and 3
    records = [
        record(0.2, 4, grad_norm=1.0),
        record(math.nan, 4, grad_norm=math.nan, nonfinite=True),
        record(0.2, 4, grad_norm=3.0),
    ]
    metrics = step_metrics(POLICY, records)
    assert metrics[POLICY.nonfinite] == 1.0
    assert metrics[POLICY.optimizer_steps] == 2.0
    assert metrics[POLICY.grad_norm] == pytest.approx(2.0, abs=1e-12)
    assert metrics[POLICY.grad_norm_max] == 3.0
    assert math.isnan(metrics[POLICY.loss])  # the NaN loss was real: it shows


def test_lr_is_the_last_optimizer_step_taken_not_a_refused_one():
    # the worker reads the lr before step(), and a refused mini-batch does not move the
    # schedule, so a refused last mini-batch carries the lr the NEXT step would apply:
    # mini-batches 1 and 2 stepped at 1e-6, the refused third read 2e-6 -> the step's lr is 1e-6
    records = [
        record(0.4, 10, lr=1e-6),
        record(0.0, 0, lr=1e-6),  # no loss tokens, but it stepped
        record(0.2, 30, grad_norm=math.nan, lr=2e-6, nonfinite=True),
    ]
    assert step_metrics(POLICY, records)[POLICY.lr] == 1e-6
    # every mini-batch refused: no step was taken; the last record's lr is what there is
    refused = [
        record(math.nan, 4, lr=3e-6, nonfinite=True),
        record(math.nan, 4, lr=4e-6, nonfinite=True),
    ]
    assert step_metrics(POLICY, refused)[POLICY.lr] == 4e-6


def test_every_mini_batch_refused_gives_nan_grad_norms():
    metrics = step_metrics(POLICY, [record(math.nan, 4, grad_norm=math.nan, nonfinite=True)])
    assert math.isnan(metrics[POLICY.grad_norm]) and math.isnan(metrics[POLICY.grad_norm_max])
    assert metrics[POLICY.optimizer_steps] == 0.0 and metrics[POLICY.nonfinite] == 1.0


def test_a_mini_batch_without_loss_tokens_does_not_dilute_the_means():
    # e.g. every response of the mini-batch masked by the overlong filter: loss 0 over 0 tokens.
    # Loss over the other one alone: 0.4 (not (0.4 + 0) / 2); it still took an optimizer step.
    records = [record(0.4, 5, kl_sum=1.0), record(0.0, 0, kl_sum=0.0)]
    metrics = step_metrics(POLICY, records)
    assert metrics[POLICY.loss] == pytest.approx(0.4, abs=1e-12)
    assert metrics[names.KL] == pytest.approx(0.2, abs=1e-12)  # 1.0 / 5
    assert metrics[POLICY.optimizer_steps] == 2.0


def test_packing_over_the_step():
    # tokens 10 + 20 = 30 over 1 + 2 = 3 micro batches of 16: fill 30 / 48 = 0.625;
    # fullest micro batch max(8, 12) = 12; rank imbalance max(1.5, 1.0) = 1.5
    records = [
        record(0.1, 2, pack=packing(10.0, 1.0, max_mb=8.0, imbalance=1.5)),
        record(0.1, 2, pack=packing(20.0, 2.0, max_mb=12.0, imbalance=1.0)),
    ]
    metrics = step_metrics(POLICY, records)
    assert metrics[POLICY.pack("local_tokens")] == 30.0
    assert metrics[POLICY.pack("local_micro_batches")] == 3.0
    assert metrics[POLICY.pack("local_samples")] == 4.0
    assert metrics[POLICY.pack("fill_ratio")] == pytest.approx(0.625, abs=1e-12)
    assert metrics[POLICY.pack("max_micro_batch_tokens")] == 12.0
    assert metrics[POLICY.pack("micro_batch_max_tokens")] == 16.0
    assert metrics[POLICY.pack("rank_token_imbalance")] == 1.5


def test_no_records_no_metrics_and_roles_keep_their_prefix():
    assert step_metrics(POLICY, []) == {}
    metrics = step_metrics(CRITIC, [record(0.3, 3)])
    assert metrics[CRITIC.loss] == pytest.approx(0.3) and "critic/loss" in metrics
    assert all(key.startswith("critic/") for key in metrics)


def test_ranks_combine_into_one_mini_batch_record():
    # loss sums add (0.3 + 0.2 = 0.5 over 6 + 2 = 8 tokens, KL 1.0 + 2.0 = 3.0, clip 1 + 0);
    # grad norm and lr are rank 0's (the same everywhere); compute is the slowest rank's;
    # tokens 10 and 20 over 1 + 2 micro batches: fill 30 / 48 = 0.625, imbalance 20 / 10 = 2
    ranks = [
        record(0.3, 6, kl_sum=1.0, clip_tokens=1, compute_s=1.0, pack=packing(10.0, 1.0)),
        record(0.2, 2, kl_sum=2.0, clip_tokens=0, compute_s=2.0, pack=packing(20.0, 2.0)),
    ]
    combined = combine_ranks(ranks)
    assert combined.losses.loss == pytest.approx(0.5, abs=1e-12)
    assert combined.losses.loss_tokens == 8.0
    assert combined.losses.token_sums == {names.KL_TERM: 3.0}
    assert combined.losses.flag_tokens == {"clip": 1.0}
    assert (combined.grad_norm, combined.lr, combined.compute_s) == (1.0, 1e-3, 2.0)
    assert combined.packing.local_tokens == 30.0 and combined.packing.local_micro_batches == 3.0
    assert combined.packing.fill_ratio == pytest.approx(0.625, abs=1e-12)
    assert combined.packing.rank_token_imbalance == 2.0
    assert not combined.nonfinite
    assert combine_ranks([ranks[0], record(0.0, 0, nonfinite=True)]).nonfinite


def test_loss_sums_read_the_loss_metric_convention():
    sums = LossSums.from_loss_metrics(
        0.7, {"loss_tokens": 4.0, "clip_tokens": 1.0, "approx_kl_sum": 0.2}
    )
    assert sums == LossSums(0.7, 4.0, {"approx_kl": 0.2}, {"clip": 1.0})
    assert sums.token_mean("approx_kl") == pytest.approx(0.05) and sums.token_frac("clip") == 0.25
    # a filler micro batch adds nothing; keys missing on one side count as 0
    assert sums + LossSums() == sums
    with pytest.raises(ValueError, match="'policy_loss' is neither a token count"):
        LossSums.from_loss_metrics(0.7, {"policy_loss": 0.7})


def test_ranks_with_different_budgets_combine_into_the_fill_of_their_capacity():
    """GPU ranks size their budgets from their own free memory: rank 0 runs 2 micro batches
    of 4096, rank 1 two of 8192, each 95% full. Fill = (2*4096*0.95 + 2*8192*0.95) /
    (2*4096 + 2*8192) = 0.95 (rank 0's budget alone gave 1.425); the combined budget is the
    mean per micro batch, (2*4096 + 2*8192) / 4 = 6144, and combining again keeps both."""

    def rank(cap: float) -> TrainStats:
        pack = PackingStats(
            local_tokens=2 * cap * 0.95, local_loss_tokens=1.0, local_samples=2.0,
            local_micro_batches=2.0, max_micro_batch_tokens=cap * 0.95,
            micro_batch_max_tokens=cap, fill_ratio=0.95, oversized_sequences=0.0,
        )  # fmt: skip
        return record(0.1, 1, pack=pack)

    combined = combine_ranks([rank(4096.0), rank(8192.0)])
    assert combined.packing.fill_ratio == pytest.approx(0.95, abs=1e-12)
    assert combined.packing.micro_batch_max_tokens == 6144.0
    metrics = step_metrics(POLICY, [combined, combine_ranks([rank(4096.0), rank(4096.0)])])
    # 3 * 2 micro batches of 4096 and 2 of 8192: capacity 40960, fill still 0.95
    assert metrics[POLICY.pack("fill_ratio")] == pytest.approx(0.95, abs=1e-12)
    assert metrics[POLICY.pack("micro_batch_max_tokens")] == 40960 / 8
