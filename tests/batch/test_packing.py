import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyrl.batch import (
    TrainingInputBatch,
    micro_batch_metrics,
    pack_micro_batches,
    pad_training_input_batch,
    plan_micro_batches,
    unpack_to_rows,
)
from skyrl.batch.packing import _best_fit_bitset, _best_fit_sorted_list


def make_chunk(lengths, seq_len=None) -> TrainingInputBatch:
    seq_len = seq_len or max(max(lengths), 1)
    n = len(lengths)
    attention = (torch.arange(seq_len) < torch.tensor(lengths)[:, None]).long()
    ids = (torch.arange(n * seq_len).reshape(n, seq_len) % 97 + 1) * attention
    return TrainingInputBatch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "loss_mask": attention.float(),
            "advantages": torch.rand(n, seq_len) * attention,
            "rewards": torch.arange(n, dtype=torch.float32),
        },
        {"uids": [f"u{i}" for i in range(n)], "is_last_step": [True] * n},
    )


def test_cap_respected_and_golden():
    # best-fit decreasing, cap 8: sorted 7,5,4,4,3 -> [7] [5 3] [4 4]; rows by first index
    groups = pack_micro_batches([4, 7, 3, 5, 4], 8)
    assert groups == [[0, 4], [1], [2, 3]]
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]


def test_lone_oversized_sequence_and_metric():
    lengths = [3, 20, 4]
    groups = pack_micro_batches(lengths, 8)
    assert [1] in groups and len(groups) == 2
    micro = plan_micro_batches(make_chunk(lengths), 8)
    metrics = micro_batch_metrics(micro, 8)
    assert metrics["oversized_sequences"] == 1
    assert metrics["max_micro_batch_tokens"] == 20


def test_deterministic_and_near_lower_bound():
    rng = np.random.default_rng(0)
    lengths = (
        rng.integers(50, 500, 4000) + np.minimum(rng.lognormal(5.7, 1.0, 4000), 3500)
    ).astype(int)
    a = pack_micro_batches(lengths, 4096)
    assert a == pack_micro_batches(lengths.tolist(), 4096)
    lower = math.ceil(lengths.sum() / 4096)
    assert lower <= len(a) <= lower * 1.02
    assert all(lengths[g].sum() <= 4096 for g in a)


def test_plan_packs_fields_and_unpacks():
    chunk = make_chunk([3, 1, 4, 2], seq_len=5)
    micro = plan_micro_batches(chunk, max_tokens=5)
    assert len(micro) == 2
    for mb in micro:
        assert mb.input_ids.shape == mb.position_ids.shape == (1, mb.num_tokens)
        assert mb.num_tokens <= 5
        assert mb.cu_seqlens.tolist() == [0, *np.cumsum(mb.seq_lens).tolist()]
        for (s, e), n in zip(mb.spans(), mb.seq_lens, strict=True):
            assert mb.position_ids[0, s:e].tolist() == list(range(n))
        assert mb["loss_mask"].shape == (1, mb.num_tokens)
        assert mb["rewards"].tolist() == [float(r) for r in mb.row_indices]
        assert mb.sample_count == len(mb.row_indices)
    # scatter the packed input ids back: the original rows come back
    restored = unpack_to_rows(micro, [mb.input_ids.float() for mb in micro], len(chunk))
    assert torch.equal(restored.long(), chunk.input_ids)
    restored_adv = unpack_to_rows(micro, [mb["advantages"] for mb in micro], len(chunk))
    assert torch.equal(restored_adv, chunk.advantages)


def test_fill_to_target_count_with_empty_zero_loss_micro_batches():
    chunk = make_chunk([3, 3, 3])
    micro = plan_micro_batches(chunk, 6, num_micro_batches=4)
    assert len(micro) == 4
    assert [mb.is_empty for mb in micro] == [False, False, True, True]
    empty = micro[-1]
    assert empty.input_ids.shape == (1, 1) and empty["loss_mask"].sum() == 0
    assert empty.sample_count == 0 and empty.num_tokens == 0
    metrics = micro_batch_metrics(micro, 6)
    assert metrics["local_micro_batches"] == 4 and metrics["local_tokens"] == 9
    assert metrics["fill_ratio"] == pytest.approx(9 / 24)
    assert metrics["local_samples"] == 3 and metrics["local_loss_tokens"] == 9
    with pytest.raises(ValueError, match="MAX over ranks"):
        plan_micro_batches(chunk, 6, num_micro_batches=1)


def test_sample_count_excludes_padding_rows():
    chunk = pad_training_input_batch(make_chunk([2, 2]), 2)
    micro = plan_micro_batches(chunk, 100)
    assert len(micro) == 1 and micro[0].sample_count == 2 and len(micro[0].row_indices) == 4


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=60),
    max_tokens=st.integers(1, 80),
)
def test_property_every_row_once_and_cap(lengths, max_tokens):
    groups = pack_micro_batches(lengths, max_tokens)
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(len(lengths)))
    for g in groups:
        assert sum(lengths[i] for i in g) <= max_tokens or len(g) == 1
    # any-fit bound: at most one micro batch is half empty -> <= 2 * tokens / cap + 1
    fitting = [n for n in lengths if n <= max_tokens]
    oversized = len(lengths) - len(fitting)
    assert len(groups) - oversized <= 2 * sum(fitting) / max_tokens + 1


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=60),
    max_tokens=st.integers(1, 80),
)
def test_property_both_best_fit_variants_agree(lengths, max_tokens):
    """The bitset and sorted-list best fit differ only in tie-breaking among bins
    with equal remaining room, so they open the same number of micro batches."""
    ordered = sorted(lengths, reverse=True)
    a = _best_fit_bitset(ordered, max_tokens)
    b = _best_fit_sorted_list(ordered, max_tokens)
    assert max(a) == max(b)
    for assignment in (a, b):
        sums: dict[int, list[int]] = {}
        for n, bin_id in zip(ordered, assignment, strict=True):
            sums.setdefault(bin_id, []).append(n)
        assert all(sum(v) <= max_tokens or len(v) == 1 for v in sums.values())


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=80),
    max_tokens=st.integers(1, 80),
)
def test_property_run_best_fit_matches_per_sequence_best_fit(lengths, max_tokens):
    """``pack_micro_batches`` (best fit over runs of equal lengths) opens exactly
    as many micro batches as per-sequence best fit decreasing."""
    groups = pack_micro_batches(lengths, max_tokens)
    reference = _best_fit_bitset(sorted(lengths, reverse=True), max_tokens)
    assert len(groups) == max(reference) + 1
    assert all(g == sorted(g) for g in groups)
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)


def test_run_best_fit_matches_on_long_tailed_lengths():
    rng = np.random.default_rng(1)
    lengths = np.minimum(
        rng.integers(50, 501, 20000) + rng.lognormal(np.log(300), 1.0, 20000), 4096
    )
    lengths = lengths.astype(int)
    for cap in (2048, 4096, 16384):
        groups = pack_micro_batches(lengths, cap)
        reference = _best_fit_bitset(sorted(lengths.tolist(), reverse=True), cap)
        assert len(groups) == max(reference) + 1
        assert all(lengths[g].sum() <= cap or len(g) == 1 for g in groups)
