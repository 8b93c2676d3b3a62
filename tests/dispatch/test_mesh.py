import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyrl.batch import TrainingInputBatch, plan_micro_batches
from skyrl.dispatch import MeshDispatch, assign_rows_to_ranks


@pytest.fixture(autouse=True)
def local_staging(request, monkeypatch):
    """These tests read the staged chunks themselves: with a Ray cluster already up in the
    session (a test file run before this one), staging would put them in the object store."""
    if "ray_cluster" not in request.fixturenames:
        from skyrl.dispatch import mesh

        monkeypatch.setattr(mesh, "_stage", lambda obj: obj)


def make_batch(lengths, uids=None, seq_len=None) -> TrainingInputBatch:
    n = len(lengths)
    seq_len = seq_len or max(lengths)
    attention = (torch.arange(seq_len) < torch.tensor(lengths)[:, None]).long()
    return TrainingInputBatch(
        {
            "input_ids": (torch.arange(n)[:, None] + 1) * attention,  # row id in every token
            "attention_mask": attention,
            "loss_mask": attention.float(),
        },
        {
            "uids": uids or [f"p{i}" for i in range(n)],
            "is_last_step": [True] * n,
            "row": list(range(n)),
        },
    )


@pytest.mark.parametrize("balance", ["tokens", "contiguous"])
def test_seven_rows_two_mini_batches_dp2(balance):
    data = make_batch([3, 1, 4, 1, 5, 9, 2])
    staged = MeshDispatch.stage_chunks(2, data, [(0, 3), (3, 7)], balance=balance)
    assert len(staged) == 2 and all(len(mb) == 2 for mb in staged)
    chunks = [c for mb in staged for c in mb]
    assert [len(c) for c in chunks] == [2, 2, 2, 2]
    zero_loss_rows = sum(int((c.loss_mask.sum(1) == 0).sum()) for c in chunks)
    assert zero_loss_rows == 1  # mini-batch 0 (3 rows) gets one padding row, mini-batch 1 none
    assert staged.pad_sizes == [1, 0]
    rows0 = sorted(r for c in staged[0] for r in c.metadata["row"])
    assert rows0 == [0, 0, 1, 2]  # the padding row carries row 0's metadata
    assert sorted(r for c in staged[1] for r in c.metadata["row"]) == [3, 4, 5, 6]
    assert data.metadata["row"] == list(range(7)) and len(data) == 7  # input untouched


def test_token_balance_beats_contiguous_and_is_reported():
    lengths = [100, 90, 80, 70, 5, 4, 3, 2]
    data = make_batch(lengths)
    balanced = MeshDispatch.stage_chunks(2, data, [(0, 8)])
    plain = MeshDispatch.stage_chunks(2, data, [(0, 8)], balance="contiguous")
    tokens = [int(c.attention_mask.sum()) for c in balanced[0]]
    assert max(tokens) / min(tokens) == pytest.approx(balanced.rank_token_imbalance[0])
    assert balanced.rank_token_imbalance[0] < 1.1 < plain.rank_token_imbalance[0]
    assert balanced[0][0].metadata["rank_token_imbalance"] == balanced.rank_token_imbalance[0]
    for chunk in balanced[0]:  # rows keep their original order on each rank
        assert chunk.metadata["row"] == sorted(chunk.metadata["row"])


def test_loss_weights_fn_sees_unpadded_mini_batch():
    data = make_batch([2, 3, 4])
    seen = []

    def weights(mini: TrainingInputBatch) -> torch.Tensor:
        seen.append(len(mini))
        return mini.loss_mask / mini.loss_mask.sum()

    staged = MeshDispatch.stage_chunks(2, data, [(0, 3)], loss_weights_fn=weights)
    assert seen == [3]
    total = sum(float(c.loss_weights.sum()) for c in staged[0])
    assert total == pytest.approx(1.0)  # padding rows carry zero weight
    assert data.loss_weights is None


def test_pass_through():
    assert MeshDispatch.pass_through(3, {"step": 5}) == [{"step": 5}] * 3


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=40),
    dp_size=st.integers(1, 4),
    num_mini=st.integers(1, 3),
    max_tokens=st.integers(8, 60),
)
def test_property_every_real_row_once_equal_micro_batch_counts(
    lengths, dp_size, num_mini, max_tokens
):
    n = len(lengths)
    cuts = sorted({0, n, *np.linspace(0, n, num_mini + 1).astype(int).tolist()})
    bounds = [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    staged = MeshDispatch.stage_chunks(dp_size, make_batch(lengths), bounds)
    seen = []
    for i, (start, end) in enumerate(bounds):
        chunks = staged[i]
        assert len({len(c) for c in chunks}) == 1
        assert sum(len(c) for c in chunks) - (end - start) == staged.pad_sizes[i] < dp_size
        # each rank plans, then all agree on the MAX count (as the workers all-reduce)
        target = max(len(plan_micro_batches(c, max_tokens)) for c in chunks)
        for chunk in chunks:
            micro = plan_micro_batches(chunk, max_tokens, num_micro_batches=target)
            assert len(micro) == target
            for mb in micro:
                assert mb.num_tokens <= max_tokens or len(mb.row_indices) == 1
                for r in mb.row_indices:
                    if not chunk.metadata.get("is_padding", [False] * len(chunk))[r]:
                        seen.append(chunk.metadata["row"][r])
    assert sorted(seen) == list(range(n))


def test_assign_rows_to_ranks_equal_counts():
    rows = assign_rows_to_ranks(np.array([5, 1, 9, 3, 7, 2]), 3)
    assert [len(r) for r in rows] == [2, 2, 2]
    assert sorted(np.concatenate(rows).tolist()) == list(range(6))
    with pytest.raises(ValueError, match="pad first"):
        assign_rows_to_ranks(np.array([1, 2, 3]), 2)


@pytest.mark.slow
def test_stages_into_ray_object_store(ray_cluster):
    ray = ray_cluster
    staged = MeshDispatch.stage_chunks(2, make_batch([3, 1, 4]), [(0, 3)])
    assert isinstance(staged[0][1], ray.ObjectRef)
    chunk = ray.get(staged[0][1])
    assert len(chunk) == 2
    assert isinstance(MeshDispatch.pass_through(2, "x")[0], ray.ObjectRef)


def test_token_imbalance_of_ranks_with_no_tokens_is_balanced():
    """1.0 = balanced: ranks of 0 and 0 tokens (a mini-batch of rows whose environments all
    failed before their first turn) read 0.0; 6 vs 2 tokens read 3.0 and 5 vs 0 read 5 / 1."""
    from skyrl.dispatch import token_imbalance

    rows = [np.array([0]), np.array([1])]
    assert token_imbalance(np.array([0, 0]), rows) == 1.0
    assert token_imbalance(np.array([6, 2]), rows) == 3.0
    assert token_imbalance(np.array([5, 0]), rows) == 5.0


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "reduction", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"]
)
def test_padding_rows_change_no_weight_and_no_count(dp_size, reduction):
    """5 rows (prompt a: 3 turns, prompt b: 2) of 6, 3, 5, 4, 2 tokens, the first token of each
    a prompt token (loss on the other 5 + 2 + 4 + 3 + 1 = 15): one mini-batch padded by
    (-5) mod dp = 0, 1, 1, 3 rows for dp 1, 2, 3, 4. Every real row keeps the weights of the
    unpadded mini-batch (found through ``source_rows``), padding rows weigh 0, and the ranks'
    packing metrics add up to the 5 rows, 20 tokens and 15 loss tokens of the data."""
    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch import micro_batch_metrics

    data = make_batch([6, 3, 5, 4, 2], uids=["a", "a", "a", "b", "b"])
    data.tensors["loss_mask"][:, 0] = 0.0

    def weights(mini: TrainingInputBatch) -> torch.Tensor:
        return compute_loss_weights(reduction, mini.loss_mask, mini.metadata["uids"], 8)

    expected = weights(data)
    (chunks,) = MeshDispatch.stage_chunks(dp_size, data, [(0, 5)], loss_weights_fn=weights)
    assert [c.metadata["pad_size"] for c in chunks] == [(-5) % dp_size] * dp_size
    metrics = []
    for chunk in chunks:
        for i, source in enumerate(chunk.metadata["source_rows"]):
            if source < 0:
                assert chunk.metadata["is_padding"][i]
                assert chunk.loss_weights[i].abs().sum() == 0 and chunk.loss_mask[i].sum() == 0
            else:
                assert torch.equal(chunk.loss_weights[i], expected[source])
                assert torch.equal(chunk.input_ids[i], data.input_ids[source])
        metrics.append(micro_batch_metrics(plan_micro_batches(chunk, 8), 8))
    assert sum(m["local_samples"] for m in metrics) == 5
    assert sum(m["local_tokens"] for m in metrics) == 20  # 6 + 3 + 5 + 4 + 2
    assert sum(m["local_loss_tokens"] for m in metrics) == 15
    total = sum(float(c.loss_weights.sum()) for c in chunks)
    assert total == pytest.approx(float(expected.sum()), abs=1e-6)


def _loss_split_batch(num_rows: int) -> TrainingInputBatch:
    """Rows of one prompt token then their loss tokens, whose values x are the advantages:
    row 0 x = [1, 2], row 1 [3], row 2 [4, 5, 6], row 3 [2] (lengths 3, 2, 4, 2)."""
    xs = [[1.0, 2.0], [3.0], [4.0, 5.0, 6.0], [2.0]][:num_rows]
    seq_len = 4
    ids = torch.zeros(num_rows, seq_len, dtype=torch.long)
    attention = torch.zeros(num_rows, seq_len, dtype=torch.long)
    loss_mask = torch.zeros(num_rows, seq_len)
    advantages = torch.zeros(num_rows, seq_len)
    for i, x in enumerate(xs):
        length = 1 + len(x)
        ids[i, :length] = torch.arange(length) + 10 * (i + 1)  # no two rows share a prompt
        attention[i, :length] = 1
        loss_mask[i, 1:length] = 1
        advantages[i, 1:length] = torch.tensor(x)
    tensors = {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
    uids = ["a", "a", "b", "b"][:num_rows]
    return TrainingInputBatch({**tensors, "advantages": advantages}, {"uids": uids})


@pytest.mark.parametrize(
    ("num_rows", "expected_grad"),
    [
        # sequence_mean: w = 1 / (|y_i| x num_seqs); per-sequence token means
        # (1+2)/2 = 1.5, 3/1 = 3, (4+5+6)/3 = 5, 2/1 = 2; (1.5 + 3 + 5 + 2) / 4 = 2.875
        (4, 2.875),
        # three rows and one zero-loss padding row: (1.5 + 3 + 5) / 3 = 19/6
        (3, 19 / 6),
    ],
)
def test_two_ranks_of_two_micro_batches_give_the_unsplit_gradient(num_rows, expected_grad):
    # per-token loss theta * x: the unsplit mini-batch's gradient is sum(w * x). Each rank
    # backpropagates dp_size x the sum of its micro batches' (loss * loss_weights) and
    # DeepSpeed averages over ranks (skyrl.workers.worker), so the update's gradient is
    # mean_r(dp_size x dL_r) = sum_r dL_r.
    from skyrl.algorithms.reductions import compute_loss_weights

    batch, dp_size = _loss_split_batch(num_rows), 2
    staged = MeshDispatch.stage_chunks(
        dp_size,
        batch,
        [(0, num_rows)],
        loss_weights_fn=lambda mini: compute_loss_weights(
            "sequence_mean", mini.loss_mask, mini.metadata["uids"], max_seq_len=4
        ),
    )
    assert staged.pad_sizes == [4 - num_rows]
    theta = torch.tensor(0.5, requires_grad=True)
    rank_grads = []
    for chunk in staged[0]:
        # a 4-token budget, rank lengths (4, 2) and (3, 2); padded (3 rows): (4, 1: the
        # padding row, row 0's first token alone) and (3, 2), each two micro batches
        micro = plan_micro_batches(chunk, max_tokens=4)
        assert len(micro) == 2
        rank_loss = sum((theta * mb["advantages"] * mb["loss_weights"]).sum() for mb in micro)
        (grad,) = torch.autograd.grad(rank_loss * dp_size, theta)
        rank_grads.append(grad)
    assert float(sum(rank_grads) / dp_size) == pytest.approx(expected_grad, rel=1e-6)
