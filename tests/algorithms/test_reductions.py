"""Loss reductions as mini-batch weights, and packing invariance (skyrl/algorithms/reductions.py)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skyrl.algorithms import LOSS_REDUCTIONS, POLICY_LOSSES, compute_loss_weights, finalize_metrics
from skyrl.config.algorithm import AlgorithmConfig

# rows with 3, 1, 2 and 0 loss tokens; prompts a = rows 0, 1 and b = rows 2, 3
MASK = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
UIDS = ["a", "a", "b", "b"]
MAX_SEQ_LEN = 8
LOSS = torch.tensor([[1.0, 2, 3, 0], [0, 4, 0, 0], [5, 6, 0, 0], [0, 0, 0, 0]])


def _weights(name):
    return compute_loss_weights(name, MASK, UIDS, MAX_SEQ_LEN)


def _rows(*per_row):
    return MASK * torch.tensor(per_row).unsqueeze(1)


def test_token_mean():
    # 6 loss tokens, each 1/6; loss (1+2+3+4+5+6)/6 = 3.5
    torch.testing.assert_close(_weights("token_mean"), MASK / 6)
    assert (LOSS * _weights("token_mean")).sum().item() == pytest.approx(3.5, abs=1e-6)


def test_sequence_mean():
    # 3 sequences have tokens (row 3 has none): 1/(3*3), 1/(1*3), 1/(2*3)
    # loss: mean of (1+2+3)/3 = 2, 4/1 = 4, (5+6)/2 = 5.5 -> 11.5/3
    torch.testing.assert_close(_weights("sequence_mean"), _rows(1 / 9, 1 / 3, 1 / 6, 0.0))
    assert (LOSS * _weights("sequence_mean")).sum().item() == pytest.approx(11.5 / 3, abs=1e-6)


def test_seq_mean_token_sum_norm():
    # token sums over max_seq_len 8, mean over 3 sequences: 1/24 each; loss 21/24
    torch.testing.assert_close(_weights("seq_mean_token_sum_norm"), MASK / 24)
    assert (LOSS * _weights("seq_mean_token_sum_norm")).sum().item() == pytest.approx(
        21 / 24, abs=1e-6
    )


def test_prompt_mean():
    # prompt a has 3+1 = 4 tokens, b has 2; 2 prompts: a tokens 1/8, b tokens 1/4
    # loss: mean of (1+2+3+4)/4 = 2.5 and (5+6)/2 = 5.5 -> 4
    torch.testing.assert_close(_weights("prompt_mean"), _rows(1 / 8, 1 / 8, 1 / 4, 1 / 4))
    assert (LOSS * _weights("prompt_mean")).sum().item() == pytest.approx(4.0, abs=1e-6)


@pytest.mark.parametrize(
    "name", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"]
)
def test_padding_rows_and_empty_batch(name):
    # zero-loss padding rows (any uid) change no weight of the real rows
    padded = torch.cat([MASK, torch.zeros(3, 4)])
    weights = compute_loss_weights(name, padded, UIDS + ["pad0", "pad1", "b"], MAX_SEQ_LEN)
    torch.testing.assert_close(weights[:4], _weights(name))
    assert torch.equal(weights[4:], torch.zeros(3, 4))
    # fully masked mini-batch: all weights 0, no NaN
    assert torch.equal(
        compute_loss_weights(name, torch.zeros(2, 3), ["a", "b"], 5), torch.zeros(2, 3)
    )


def test_bad_input():
    with pytest.raises(ValueError, match="uids"):
        compute_loss_weights("token_mean", MASK, UIDS[:3], MAX_SEQ_LEN)
    with pytest.raises(KeyError, match="registered: prompt_mean, seq_mean_token_sum_norm"):
        compute_loss_weights("mean", MASK, UIDS, MAX_SEQ_LEN)


def _make_minibatch(lengths, group_sizes, seq_len, seed):
    """Right-aligned responses after a 1-token prompt; NaN off the mask everywhere."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    mask = torch.zeros(batch, seq_len)
    for i, n in enumerate(lengths):
        mask[i, 1 : 1 + n] = 1.0
    uids = [f"p{g}" for g, size in enumerate(group_sizes) for _ in range(size)][:batch]
    uids += [f"p{len(group_sizes) + i}" for i in range(batch - len(uids))]
    on = mask > 0
    old = torch.where(
        on, -torch.rand(batch, seq_len, generator=gen, dtype=torch.float64) * 3, float("nan")
    )
    logprobs = torch.where(
        on,
        old + (torch.rand(batch, seq_len, generator=gen, dtype=torch.float64) - 0.5),
        float("nan"),
    )
    adv = torch.where(
        on, torch.randn(batch, seq_len, generator=gen, dtype=torch.float64), float("nan")
    )
    return mask, uids, logprobs, old, adv


def _pack(order, lengths, budget_tokens):
    """Greedy token-budget packing of rows in ``order``: a row never splits; ragged last micro batch."""
    micro, current, used = [], [], 0
    for row in order:
        cost = max(lengths[row], 1)
        if current and used + cost > budget_tokens:
            micro.append(current)
            current, used = [], 0
        current.append(row)
        used += cost
    if current:
        micro.append(current)
    return micro


def _sum_over_packing(loss_name, cfg, tensors, weights, order, dp_size, budget_tokens, lengths):
    mask, logprobs, old, adv = tensors
    batch, seq_len = mask.shape
    pad_rows = (-batch) % dp_size  # DP padding: zero-loss rows, NaN everywhere
    nan_rows = torch.full((pad_rows, seq_len), float("nan"), dtype=torch.float64)
    zero_rows = torch.zeros(pad_rows, seq_len)
    mask_p, w_p = torch.cat([mask, zero_rows]), torch.cat([weights, zero_rows])
    lp_p, old_p, adv_p = (torch.cat([t, nan_rows]) for t in (logprobs, old, adv))
    order = list(order) + list(range(batch, batch + pad_rows))
    lengths = list(lengths) + [0] * pad_rows
    per_rank = len(order) // dp_size
    total, metrics = torch.zeros((), dtype=torch.float64), {}
    for rank in range(dp_size):
        for rows in _pack(order[rank * per_rank : (rank + 1) * per_rank], lengths, budget_tokens):
            idx = torch.tensor(rows)
            loss, m = POLICY_LOSSES.get(loss_name)(
                lp_p[idx], old_p[idx], adv_p[idx], w_p[idx], mask_p[idx], cfg
            )
            total = total + loss
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v
    return total, metrics


def _check_invariance(
    loss_name, reduction, lengths, group_sizes, order, dp_size, budget_tokens, seed
):
    seq_len = max(lengths) + 2
    mask, uids, logprobs, old, adv = _make_minibatch(lengths, group_sizes, seq_len, seed)
    weights = compute_loss_weights(reduction, mask, uids, max_seq_len=seq_len)
    cfg = AlgorithmConfig(eps_clip_low=0.1, eps_clip_high=0.15, clip_ratio_c=3.0)
    full, full_metrics = POLICY_LOSSES.get(loss_name)(logprobs, old, adv, weights, mask, cfg)
    packed, packed_metrics = _sum_over_packing(
        loss_name, cfg, (mask, logprobs, old, adv), weights, order, dp_size, budget_tokens, lengths
    )
    assert torch.isfinite(full)
    torch.testing.assert_close(packed, full, rtol=1e-12, atol=1e-12)
    assert finalize_metrics(packed_metrics) == pytest.approx(
        finalize_metrics(full_metrics), rel=1e-9
    )


@pytest.mark.parametrize("loss_name", ["ppo", "gspo", "cispo"])
@pytest.mark.parametrize(
    "reduction", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"]
)
def test_packing_invariance_fixed(loss_name, reduction):
    # 7 sequences (one with no loss tokens) of 3 prompts, dp_size 2 (one padding row),
    # budget 6 tokens per micro batch: uneven, ragged micro batches
    lengths = [5, 1, 3, 0, 6, 2, 4]
    _check_invariance(loss_name, reduction, lengths, [2, 3, 2], range(7), 2, 6, seed=0)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    lengths=st.lists(st.integers(0, 7), min_size=1, max_size=10),
    dp_size=st.integers(1, 3),
    budget_tokens=st.integers(1, 16),
    loss_name=st.sampled_from(["ppo", "gspo", "cispo"]),
    reduction=st.sampled_from(LOSS_REDUCTIONS.names()),
    seed=st.integers(0, 2**16),
)
def test_packing_invariance_property(
    data, lengths, dp_size, budget_tokens, loss_name, reduction, seed
):
    group_sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=len(lengths)))
    order = data.draw(st.permutations(range(len(lengths))))
    _check_invariance(
        loss_name, reduction, lengths, group_sizes, order, dp_size, budget_tokens, seed
    )
