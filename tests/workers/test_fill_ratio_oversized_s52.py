"""``policy/pack/fill_ratio`` is a share of the micro batches' capacity: a sequence longer than
``trainer.micro_batch_max_tokens`` is packed alone, and its micro batch holds what it holds
(its capacity is its own length), so a budget below the longest sequence does not read as a
fill above 1 (a smoke run with a 40-token budget logged 3.35)."""

import pytest
import torch

from skyrl.batch import TrainingInputBatch
from skyrl.batch.packing import micro_batch_metrics, plan_micro_batches
from skyrl.workers.stats import LossSums, PackingStats, TrainStats, combine_ranks


def chunk_of(lengths: list[int]) -> TrainingInputBatch:
    n, s = len(lengths), max(lengths)
    attention = (torch.arange(s) < torch.tensor(lengths)[:, None]).long()
    ids = (torch.arange(n * s).reshape(n, s) % 97 + 1) * attention
    return TrainingInputBatch(
        {"input_ids": ids, "attention_mask": attention, "loss_mask": attention.float()},
        {"uids": [f"u{i}" for i in range(n)], "is_last_step": [True] * n},
    )


def rank_record(lengths: list[int], budget: int) -> TrainStats:
    metrics = micro_batch_metrics(plan_micro_batches(chunk_of(lengths), budget), budget)
    return TrainStats(LossSums(), 1.0, 1e-5, False, 0.0, PackingStats(**metrics))


def test_a_sequence_over_the_budget_fills_its_own_micro_batch():
    # budget 16: [30] alone (over the budget: its capacity is its 30 tokens), [10] in a
    # micro batch of 16 -> 40 real tokens / (30 + 16) capacity; budgets alone gave 40 / 32
    metrics = micro_batch_metrics(plan_micro_batches(chunk_of([10, 30]), 16), 16)
    assert metrics["local_micro_batches"] == 2 and metrics["oversized_sequences"] == 1
    assert metrics["capacity_tokens"] == 46
    assert metrics["fill_ratio"] == pytest.approx(40 / 46, abs=1e-12)


def test_every_sequence_over_the_budget_is_a_full_pack():
    # the smoke run's case: each sequence alone, each micro batch exactly full
    metrics = micro_batch_metrics(plan_micro_batches(chunk_of([134, 120, 90]), 40), 40)
    assert metrics["local_micro_batches"] == 3
    assert metrics["fill_ratio"] == pytest.approx(1.0, abs=1e-12)


def test_ranks_combine_into_the_fill_of_their_capacity():
    # rank 0: [30] alone + [10] -> 40 tokens of 46; rank 1: [8 8] in one 16 -> 16 of 16
    combined = combine_ranks([rank_record([10, 30], 16), rank_record([8, 8], 16)])
    assert combined.packing.capacity_tokens == 62
    assert combined.packing.fill_ratio == pytest.approx(56 / 62, abs=1e-12)
    assert combined.packing.micro_batch_max_tokens == 16  # the budget, as before
