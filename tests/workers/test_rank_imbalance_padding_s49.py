"""The logged rank token imbalance counts the tokens each rank computes, its data-parallel
padding rows' included, as the dispatch balanced them (``combine_ranks``)."""

import pytest
import ray
import torch

from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.batch.packing import micro_batch_metrics, plan_micro_batches
from skyrl.dispatch import MeshDispatch
from skyrl.workers.stats import LossSums, PackingStats, TrainStats, combine_ranks

PROMPT = 4


def one_sample_per_prompt(lengths: list[int]) -> TrainingInputBatch:
    n, s = len(lengths), max(lengths)
    attention = torch.zeros(n, s, dtype=torch.long)
    for i, length in enumerate(lengths):
        attention[i, :length] = 1
    loss_mask = attention.float()
    loss_mask[:, :PROMPT] = 0
    ids = (torch.arange(n * s).reshape(n, s) % 200 + 3) * attention
    uids = [f"p{i}" for i in range(n)]
    return TrainingInputBatch(
        {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask},
        {"uids": uids, "is_last_step": [True] * n},
    )


def staged_and_logged(lengths: list[int]) -> tuple[float, float, list[float]]:
    """The dispatch's imbalance of one mini-batch of all rows over 2 ranks, the one the step
    logs from the ranks' packing records, and each rank's real tokens."""
    batch = one_sample_per_prompt(lengths)
    n = len(lengths)
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], n, n)
    staged = MeshDispatch.stage_chunks(2, batch, bounds)
    records = []
    for staged_chunk in staged[0]:  # an object ref while the session's Ray is up
        chunk = ray.get(staged_chunk) if isinstance(staged_chunk, ray.ObjectRef) else staged_chunk
        metrics = micro_batch_metrics(plan_micro_batches(chunk, 2048), 2048)
        records.append(TrainStats(LossSums(), 1.0, 1e-5, False, 0.0, PackingStats(**metrics)))
    logged = combine_ranks(records).packing.rank_token_imbalance
    return staged.rank_token_imbalance[0], logged, [r.packing.local_tokens for r in records]


def test_equal_rows_with_one_padding_row():
    # 3 rows of 10 tokens over 2 ranks: a 4th row (row 0's first token alone) pads them;
    # dealt longest first in serpentine order: rank 0 gets a 10-row and the padding row, rank
    # 1 two 10-rows: 20 / 11, not 20 / 10 (data alone)
    staged, logged, real = staged_and_logged([10, 10, 10])
    assert sorted(real) == [10.0, 20.0]
    assert staged == logged == pytest.approx(20 / 11)


def test_a_rank_busy_with_a_padding_row_counts_it():
    # rows 30, 10, 10 + a padding row of 1 token: rank 0 gets 30 and the padding row (31
    # tokens computed), rank 1 10 and 10: 31 / 20; counting data alone said 30 / 20 (and a
    # padding row copying the whole 30-row made both ranks compute 40)
    staged, logged, real = staged_and_logged([30, 10, 10])
    assert sorted(real) == [20.0, 30.0]
    assert staged == logged == pytest.approx(31 / 20)


def test_padding_tokens_count_in_combine_ranks():
    def record(tokens: float, padding: float) -> TrainStats:
        packing = PackingStats(
            local_tokens=tokens, local_loss_tokens=0, local_samples=1, local_micro_batches=1,
            max_micro_batch_tokens=tokens + padding, micro_batch_max_tokens=64,
            fill_ratio=tokens / 64, oversized_sequences=0, padding_tokens=padding,
        )  # fmt: skip
        return TrainStats(LossSums(), 1.0, 1e-5, False, 0.0, packing)

    # (30 + 0) / (10 + 5) = 2; data only would say 3; local_tokens still add the data only
    combined = combine_ranks([record(30, 0), record(10, 5)])
    assert combined.packing.rank_token_imbalance == pytest.approx(2.0)
    assert combined.packing.local_tokens == 40
    assert combined.packing.padding_tokens == 5
