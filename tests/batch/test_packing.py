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
        assert mb.token_index.tolist() == list(range(mb.num_tokens))  # nothing shared
        starts = np.cumsum([0, *mb.seq_lens[:-1]]).tolist()
        for s, n in zip(starts, mb.seq_lens, strict=True):
            assert mb.position_ids[0, s : s + n].tolist() == list(range(n))
            assert mb.parents[s : s + n].tolist() == [-1, *range(s, s + n - 1)]
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


def shared_prompt_chunk() -> TrainingInputBatch:
    """Rows 0-2 share the prompt [5, 6, 7]; row 3's prompt differs in its first token; row 4
    has no loss token."""
    rows = [[5, 6, 7, 8, 9], [5, 6, 7, 1], [5, 6, 7, 2, 3, 4], [4, 6, 7, 8], [1, 2, 3]]
    prompt = [3, 3, 3, 3, 3]
    seq_len = 6
    ids = torch.zeros(len(rows), seq_len, dtype=torch.long)
    attention = torch.zeros(len(rows), seq_len, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), seq_len)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        loss_mask[i, prompt[i] : len(row)] = 1.0 if i != 4 else 0.0
    return TrainingInputBatch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "loss_mask": loss_mask,
            "advantages": torch.arange(len(rows), dtype=torch.float32)[:, None] * loss_mask,
        },
        {"uids": ["a", "a", "a", "b", "c"]},
    )


def test_rows_with_one_prompt_pack_it_once():
    chunk = shared_prompt_chunk()
    (mb,) = plan_micro_batches(chunk, max_tokens=20, share_prefixes=True)
    assert mb.row_indices == [0, 1, 2, 3, 4]
    # the prompt [5 6 7] once, then rows 0, 1, 2's own tokens, then rows 3 and 4 whole
    assert mb.input_ids[0].tolist() == [5, 6, 7, 8, 9, 1, 2, 3, 4, 4, 6, 7, 8, 1, 2, 3]
    # each row's own tokens go on from the prompt's length 3
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3, 3, 4, 5, 0, 1, 2, 3, 0, 1, 2]
    # row 1's token 1 (at 5) and row 2's token 2 (at 6) are predicted by the prompt's last (2)
    assert mb.parents.tolist() == [-1, 0, 1, 2, 3, 2, 2, 6, 7, -1, 9, 10, 11, -1, 13, 14]
    # real tokens of rows 0..4 -> packed positions; the prompt's three go to every row of it
    assert mb.token_index.tolist() == [
        *[0, 1, 2, 3, 4],
        *[0, 1, 2, 5],
        *[0, 1, 2, 6, 7, 8],
        *[9, 10, 11, 12],
        *[13, 14, 15],
    ]
    assert mb.num_tokens == 16 and mb.sequence_tokens == 22
    # token fields follow the layout (the prompt's from row 0: no loss there in any row)
    assert mb["advantages"][0].tolist() == [0, 0, 0, 0, 0, 1, 2, 2, 2, 0, 0, 0, 3, 0, 0, 0]
    restored = unpack_to_rows([mb], [mb.input_ids.float()], len(chunk))
    assert torch.equal(restored.long(), chunk.input_ids)
    metrics = micro_batch_metrics([mb], 20)
    assert metrics["local_tokens"] == 16 and metrics["shared_prefix_tokens"] == 6  # 22 - 16


def test_a_shared_prompt_unit_splits_at_the_budget():
    chunk = shared_prompt_chunk()
    # budget 7: rows 0 (3 + 2) and 1 (+1) share the prompt (6 tokens); row 2 (+3 = 9) starts a
    # unit of its own, which holds one row and so is packed whole (6 tokens)
    micro = plan_micro_batches(chunk, max_tokens=7, share_prefixes=True)
    packed = {tuple(mb.row_indices): mb for mb in micro}
    assert packed[(0, 1)].input_ids[0].tolist() == [5, 6, 7, 8, 9, 1]
    assert all(mb.num_tokens <= 7 for mb in micro)
    assert sorted(r for mb in micro for r in mb.row_indices) == [0, 1, 2, 3, 4]
    restored = unpack_to_rows(micro, [mb.input_ids.float() for mb in micro], len(chunk))
    assert torch.equal(restored.long(), chunk.input_ids)


def test_without_sharing_every_row_is_packed_whole():
    chunk = shared_prompt_chunk()
    (mb,) = plan_micro_batches(chunk, max_tokens=22)
    assert mb.num_tokens == mb.sequence_tokens == 22
    assert micro_batch_metrics([mb], 22)["shared_prefix_tokens"] == 0


def test_padding_rows_are_computed_but_not_counted_as_data():
    """A dp padding row is row 0's first token alone: that token is computed
    (``padding_tokens``) but is neither ``local_tokens`` nor an oversized sequence."""
    chunk = pad_training_input_batch(make_chunk([20, 6, 6]), 1)  # row 3: the 20-row's 1st token
    micro = plan_micro_batches(chunk, 16)
    metrics = micro_batch_metrics(micro, 16)
    assert metrics["local_tokens"] == 20 + 6 + 6  # 32, not 33
    assert metrics["padding_tokens"] == 1  # a copy of the whole row computed 20
    assert metrics["oversized_sequences"] == 1  # the real 20-token row only
    assert metrics["local_samples"] == 3
    # 2 micro batches ([20], [6 6 1]) of 16 (a whole-row copy made 3: [20], [20], [6 6]);
    # real fill 32 / (20 + 16): the 20-token row, alone, is a full micro batch of 20
    assert [mb.row_indices for mb in micro] == [[0], [1, 2, 3]]
    assert metrics["local_micro_batches"] == 2
    assert metrics["fill_ratio"] == pytest.approx(32 / 36)


@pytest.mark.parametrize("share", [False, True])
def test_a_chunk_of_only_empty_rows_packs_into_a_filler(share):
    """A prompt whose env failed at init gives rows of no tokens; a rank whose share is only
    such rows packed a micro batch of 0 tokens (not ``is_empty``), and the model's forward
    raised. It is a zero-loss filler now, and those rows unpack to zeros."""
    chunk = make_chunk([0, 0], seq_len=4)
    micro = plan_micro_batches(chunk, 8, share_prefixes=share)
    assert len(micro) == 1 and micro[0].is_empty and micro[0].input_ids.shape == (1, 1)
    out = unpack_to_rows(micro, [torch.ones(1, 1)], 2)
    assert out.shape == (2, 4) and not out.any()
    mixed = plan_micro_batches(make_chunk([3, 0], seq_len=4), 8, share_prefixes=share)
    assert [mb.row_indices for mb in mixed] == [[0, 1]]  # an empty row beside others is kept


@pytest.mark.parametrize("share", [False, True])
def test_rows_of_no_tokens_open_no_micro_batch_of_their_own(share):
    """A row of no tokens costs nothing, yet when every micro batch was full it got a micro
    batch of its own: a zero-loss filler that every rank then ran (they match the busiest
    rank's count), and ``local_samples`` counted the row only when it found room. Rows 8, 0
    under a budget of 8: one micro batch; rows 20, 0 (oversized): one; 4, 4, 0: one (4 + 4 =
    8). ``local_samples`` counts the rows with a token: 1, 1, 2 (and 1 for 7, 0, which fitted
    before)."""
    cases = [([8, 0], [[0, 1]], 1), ([20, 0], [[0, 1]], 1), ([4, 4, 0], [[0, 1, 2]], 2)]
    for lengths, groups, samples in [*cases, ([7, 0], [[0, 1]], 1)]:
        micro = plan_micro_batches(make_chunk(lengths, seq_len=20), 8, share_prefixes=share)
        assert [mb.row_indices for mb in micro] == groups, lengths
        metrics = micro_batch_metrics(micro, 8)
        assert metrics["local_micro_batches"] == 1 and metrics["local_samples"] == samples
        out = unpack_to_rows(micro, [mb.input_ids.float() for mb in micro], len(lengths))
        assert not out[-1].any()  # the row of no tokens unpacks to zeros
    # the lightest micro batch takes them: budget 8, rows 6, 5, 0 -> [6] [5 0]
    micro = plan_micro_batches(make_chunk([6, 5, 0]), 8, share_prefixes=share)
    assert [mb.row_indices for mb in micro] == [[0], [1, 2]]


def test_padding_rows_share_no_prompt():
    """Padding rows copied row 0 with loss mask 0, so their whole length looked like a prompt
    shared with each other (and with row 0): ``local_tokens`` came out negative. Each is a
    unit of its own. Rows: a 6-token row (prompt 5 + 1 response token) and two padding
    rows (its first token alone); shared, 6 real tokens + 2 x 1 padding tokens are computed."""
    chunk = make_chunk([6, 3])
    chunk.tensors["loss_mask"][0, :5] = 0  # row 0: prompt of 5, one response token
    padded = pad_training_input_batch(chunk.select_rows([0]), 2)
    micro = plan_micro_batches(padded, 64, share_prefixes=True)
    metrics = micro_batch_metrics(micro, 64)
    assert metrics["local_tokens"] == 6 and metrics["padding_tokens"] == 2
    assert sum(mb.num_tokens for mb in micro) == 8


def test_shared_prompts_give_the_same_logprobs_and_gradients_as_whole_rows():
    """``trainer.share_prompts`` promises the same gradients. On the tiny model: prompt a (5
    tokens) with samples of 4, 2 and 1 own tokens (the last with no loss token: an env error),
    prompt b (3 tokens) with 6, 3 and 0 own tokens, and one data-parallel padding row; a
    token-mean loss ``sum(logprob x advantage x weight)``. Budget 64 packs everything in one
    micro batch: 9 + 7 + 6 + 9 + 6 + 3 + 1 (padding) = 41 tokens whole; shared, a's prompt
    once for its 3 rows and b's once for its 2 with a response: 41 - 2 x 5 - 3 = 28. Budget
    9 splits the units: a's 9-token sample alone, then a's prompt + 2 + 1 = 8 shared; b's
    9-token sample alone, its 6 + 3 whole; the padding row's one token fills a's 8 to 9
    (a copy of the whole 9-token row 0 took a micro batch of its own). Every packing gives the gradients and loss-token
    logprobs of the whole rows in one micro batch."""
    from skyrl.models import build_tiny_model
    from skyrl.workers.logprobs import packed_logprobs
    from skyrl.workers.models import load_causal_lm

    gen = torch.Generator().manual_seed(11)
    prompts = [
        torch.randint(3, 256, (5,), generator=gen),
        torch.randint(3, 256, (3,), generator=gen),
    ]
    rows = [(0, 4), (0, 2), (0, 1), (1, 6), (1, 3), (1, 0)]  # (prompt, own tokens)
    seq_len = 12
    ids = torch.zeros(len(rows), seq_len, dtype=torch.long)
    attention, loss_mask = torch.zeros_like(ids), torch.zeros(len(rows), seq_len)
    for i, (p, own) in enumerate(rows):
        seq = torch.cat([prompts[p], torch.randint(3, 256, (own,), generator=gen)])
        ids[i, : len(seq)], attention[i, : len(seq)] = seq, 1
        loss_mask[i, len(prompts[p]) : len(seq)] = 1.0
    loss_mask[2] = 0.0  # an env error: no loss token
    chunk = TrainingInputBatch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "loss_mask": loss_mask,
            "advantages": torch.randn(len(rows), seq_len, generator=gen) * loss_mask,
            "loss_weights": loss_mask / loss_mask.sum(),
        },
        {"uids": ["a"] * 3 + ["b"] * 3},
    )
    chunk = pad_training_input_batch(chunk, 1)
    path = build_tiny_model()
    results = {}
    for budget, share in [(64, False), (64, True), (9, False), (9, True)]:
        model = load_causal_lm(path, "fp32", packed_attention="per_sequence").train()
        micro = plan_micro_batches(chunk, budget, share_prefixes=share)
        outs = [
            packed_logprobs(model, mb, loss_tokens_only=True, logits_to_keep=True) for mb in micro
        ]
        logprobs = unpack_to_rows(micro, [o.logprobs for o in outs], len(chunk))
        (logprobs * chunk.advantages * chunk.loss_weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[budget, share] = micro, logprobs.detach(), grads
    (whole,), _, _ = results[64, False]
    assert whole.num_tokens == 41
    (shared,), _, _ = results[64, True]
    assert shared.num_tokens == 28
    assert [mb.row_indices for mb in results[9, True][0]] == [[0], [1, 2, 6], [3], [4, 5]]
    _, reference_logprobs, reference_grads = results[64, False]
    loss = chunk.loss_mask > 0
    for key, (_, logprobs, grads) in results.items():
        torch.testing.assert_close(logprobs[loss], reference_logprobs[loss], atol=1e-5, rtol=0)
        assert grads.keys() == reference_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(
                grad, reference_grads[name], atol=1e-5, rtol=1e-5, msg=f"{key} {name}"
            )


def random_prompt_chunk(rng) -> TrainingInputBatch:
    """Up to 9 rows drawn from up to 3 prompts of 0-6 tokens, each with 0-6 own tokens (loss
    on them, except in about one row in five: an env error); sometimes 1-3 padding rows."""
    prompts = [[rng.randint(1, 9) for _ in range(rng.randint(0, 6))] for _ in range(3)]
    rows = []
    for _ in range(rng.randint(1, 9)):
        own = [rng.randint(1, 9) for _ in range(rng.randint(0, 6))]
        rows.append((rng.choice(prompts), own, rng.random() < 0.2))
    seq_len = max(1, max(len(p) + len(o) for p, o, _ in rows))
    n = len(rows)
    ids = torch.zeros(n, seq_len, dtype=torch.long)
    attention, loss_mask = torch.zeros_like(ids), torch.zeros(n, seq_len)
    for i, (prompt, own, no_loss) in enumerate(rows):
        seq = prompt + own
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        loss_mask[i, len(prompt) : len(seq)] = 0.0 if no_loss else 1.0
    chunk = TrainingInputBatch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "loss_mask": loss_mask,
            "advantages": torch.randn(n, seq_len) * loss_mask,
        },
        {"uids": [f"u{i}" for i in range(n)]},
    )
    return pad_training_input_batch(chunk, rng.choice([0, 0, 1, 3]))


def test_random_chunks_pack_every_row_once_attending_to_its_own_tokens_only():
    """For every real token t of every row, packed with or without shared prompts under budgets
    1-30: its id, position (t), field values, parent (the packed position of token t - 1, -1
    at t = 0) and the keys its query attends to (``attention_spans``: exactly the packed
    positions of the row's tokens 0..t) are those of the row alone; every row with a token is
    in exactly one micro batch, within the budget unless it is the only row with a token
    there; unpack gives the rows back."""
    import random

    from skyrl.workers.packed_attention import attention_spans

    for seed in range(300):
        rng = random.Random(seed)
        chunk = random_prompt_chunk(rng)
        budget, share = rng.randint(1, 30), rng.random() < 0.7
        micro = plan_micro_batches(chunk, budget, share_prefixes=share)
        packed_rows = [r for mb in micro for r in mb.row_indices]
        assert len(packed_rows) == len(set(packed_rows)), seed
        assert set(packed_rows) >= set(torch.nonzero(chunk.real_lengths()).flatten().tolist())
        for mb in (mb for mb in micro if not mb.is_empty):
            with_tokens = sum(n > 0 for n in mb.seq_lens)  # rows of none join any
            assert mb.num_tokens <= budget or with_tokens == 1, seed
            keys_of = {}
            for start, end, prefix_start, prefix_len in attention_spans(mb.position_ids[0]):
                prefix = set(range(prefix_start, prefix_start + prefix_len))
                keys_of.update({q: prefix | set(range(start, q + 1)) for q in range(start, end)})
            offsets = np.cumsum([0, *mb.seq_lens]).tolist()
            for row, first, n in zip(mb.row_indices, offsets, mb.seq_lens, strict=False):
                at = mb.token_index[first : first + n].tolist()
                assert mb.input_ids[0, at].tolist() == chunk.input_ids[row, :n].tolist(), seed
                assert mb.position_ids[0, at].tolist() == list(range(n)), seed
                assert mb.parents[at].tolist() == [-1, *at[:-1]][:n], seed
                assert all(keys_of[at[t]] == set(at[: t + 1]) for t in range(n)), seed
                for key in ("loss_mask", "advantages"):
                    assert torch.equal(mb[key][0, at], chunk[key][row, :n]), (seed, key)
        restored = unpack_to_rows(micro, [mb.input_ids.float() for mb in micro], len(chunk))
        assert torch.equal(restored.long(), chunk.input_ids), seed
