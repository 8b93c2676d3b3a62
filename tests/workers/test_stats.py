"""The mini-batch record combined from its ranks' (``combine_ranks``)."""

import pytest

from skyrl.workers.stats import LossSums, PackingStats, TrainStats, combine_ranks


def rank_record(tokens: float) -> TrainStats:
    packing = PackingStats(
        local_tokens=tokens,
        local_loss_tokens=tokens / 2,
        local_samples=2,
        local_micro_batches=1,
        max_micro_batch_tokens=tokens,
        micro_batch_max_tokens=64,
        fill_ratio=tokens / 64,
        oversized_sequences=0,
    )
    return TrainStats(losses=LossSums(), grad_norm=1.0, lr=1e-5, nonfinite=False,
                      compute_s=0.5, packing=packing)  # fmt: skip


@pytest.mark.parametrize(
    ("tokens", "imbalance"),
    [
        ((30, 10), 3.0),  # busiest 30 over least busy 10
        ((30, 0), 30.0),  # a rank of none counts as 1 token
        ((0, 0), 1.0),  # no rank has tokens (every row an env that failed at init): balanced
    ],
)
def test_rank_token_imbalance_is_busiest_over_least_busy(tokens, imbalance):
    combined = combine_ranks([rank_record(t) for t in tokens])
    assert combined.packing.rank_token_imbalance == imbalance
    assert combined.packing.local_tokens == sum(tokens)
