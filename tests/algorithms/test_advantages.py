"""Advantage estimators on small hand-computed batches (skyrl/algorithms/advantages/)."""

import math

import pytest
import torch

from skyrl.algorithms import AdvantageInputs, compute_advantages
from skyrl.config.algorithm import AlgorithmConfig

NAN = float("nan")

# Two prompt groups: "a" has 3 samples, "b" has 2; unequal response lengths.
UIDS = ["a", "a", "a", "b", "b"]
REWARDS = torch.tensor([1.0, 0.0, 0.5, 2.0, 0.0])
MASK = torch.tensor(
    [
        [0, 1, 1, 0],
        [0, 1, 1, 1],
        [1, 1, 0, 0],
        [0, 0, 1, 1],
        [0, 1, 0, 0],
    ],
    dtype=torch.float32,
)


def _tokens(per_seq: list[float]) -> torch.Tensor:
    return MASK * torch.tensor(per_seq).unsqueeze(1)


def _run(name: str, inputs: AdvantageInputs, **cfg) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_advantages(inputs, AlgorithmConfig(advantage_estimator=name, **cfg))


def test_grpo_with_std():
    # a: mean 0.5, deviations (0.5, -0.5, 0), unbiased var (0.25+0.25+0)/2 = 0.25 -> std 0.5
    # b: mean 1.0, deviations (1, -1), unbiased var (1+1)/1 = 2 -> std sqrt(2)
    sa, sb = 0.5 + 1e-6, math.sqrt(2) + 1e-6
    adv, ret = _run("grpo", AdvantageInputs(REWARDS, MASK, UIDS))
    expected = _tokens([0.5 / sa, -0.5 / sa, 0.0, 1 / sb, -1 / sb])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(ret, expected, rtol=0, atol=1e-7)


def test_grpo_without_std_and_dr_grpo():
    # deviations from the group mean only: a (0.5, -0.5, 0), b (1, -1)
    expected = _tokens([0.5, -0.5, 0.0, 1.0, -1.0])
    adv, _ = _run("grpo", AdvantageInputs(REWARDS, MASK, UIDS), norm_adv_by_std=False)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)
    # dr_grpo never divides, whatever norm_adv_by_std says
    adv, _ = _run("dr_grpo", AdvantageInputs(REWARDS, MASK, UIDS), norm_adv_by_std=True)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)


def test_grpo_single_sample_group_and_token_rewards():
    # group "c" has one sample -> no baseline information -> advantage 0.
    # token_rewards (KL in reward) add their masked sum to the score; the NaN sits off the mask.
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    token_rewards = torch.tensor([[-0.1, -0.1], [-0.1, NAN], [-0.3, -0.3]])
    # scores: a: 1 - 0.2 = 0.8, 0 - 0.1 = -0.1 -> mean 0.35 -> (0.45, -0.45); c: 0
    inputs = AdvantageInputs(
        torch.tensor([1.0, 0.0, 5.0]), mask, ["a", "a", "c"], token_rewards=token_rewards
    )
    adv, _ = _run("dr_grpo", inputs)
    torch.testing.assert_close(
        adv, torch.tensor([[0.45, 0.45], [-0.45, 0.0], [0.0, 0.0]]), rtol=0, atol=1e-6
    )


def test_rloo():
    # a: 1 - (0 + 0.5)/2 = 0.75; 0 - (1 + 0.5)/2 = -0.75; 0.5 - (1 + 0)/2 = 0
    # b: 2 - 0 = 2; 0 - 2 = -2
    adv, ret = _run("rloo", AdvantageInputs(REWARDS, MASK, UIDS))
    expected = _tokens([0.75, -0.75, 0.0, 2.0, -2.0])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(ret, expected, rtol=0, atol=1e-7)


def test_reinforce_pp_discounted_and_batch_normalised():
    # gamma 0.5. Row 0: loss tokens t0..t2, KL reward -0.1 each, outcome 1 on t2:
    #   G2 = 0.9, G1 = -0.1 + 0.5*0.9 = 0.35, G0 = -0.1 + 0.5*0.35 = 0.075
    # Row 1: loss tokens t1, t3 (t2 is an env token: skipped, not discounted), KL -0.2, outcome 0:
    #   G3 = -0.2, G1 = -0.2 + 0.5*(-0.2) = -0.3
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    token_rewards = torch.tensor([[-0.1, -0.1, -0.1, NAN], [NAN, -0.2, NAN, -0.2]])
    inputs = AdvantageInputs(
        torch.tensor([1.0, 0.0]), mask, ["a", "b"], token_rewards=token_rewards
    )
    adv, ret = _run("reinforce_pp", inputs, gamma=0.5)
    torch.testing.assert_close(
        ret, torch.tensor([[0.075, 0.35, 0.9, 0.0], [0.0, -0.3, 0.0, -0.2]]), rtol=0, atol=1e-6
    )
    # whiten over the 5 loss tokens: mean 0.825/5 = 0.165; deviations
    # (-0.09, 0.185, 0.735, -0.465, -0.365), squares sum 0.932, unbiased var 0.932/4 = 0.233
    std = math.sqrt(0.233) + 1e-8
    expected = torch.tensor([[-0.09, 0.185, 0.735, 0.0], [0.0, -0.465, 0.0, -0.365]]) / std
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_reinforce_pp_baseline():
    # a: rewards (1, 0) -> minus mean 0.5 -> (0.5, -0.5); b: (2, 0) -> (1, -1)
    # tokens: row0 2 x 0.5, row1 1 x -0.5, row2 3 x 1, row3 1 x -1 -> 7 tokens, sum 2.5
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 0]])
    adv, _ = _run(
        "reinforce_pp_baseline",
        AdvantageInputs(torch.tensor([1.0, 0, 2, 0]), mask, ["a", "a", "b", "b"]),
    )
    values = [0.5, 0.5, -0.5, 1, 1, 1, -1]
    mean = 2.5 / 7
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 6) + 1e-8
    per_seq = torch.tensor([0.5, -0.5, 1.0, -1.0])
    torch.testing.assert_close(adv, mask * (per_seq.unsqueeze(1) - mean) / std, rtol=0, atol=1e-6)


def test_gae_with_gamma_lambda_and_mask():
    # gamma 0.9, lambda 0.8 (gamma*lambda = 0.72); V = 0 after the last loss token.
    # Row 0: loss tokens t1..t3, V = (0.5, 0.4, 0.2), outcome 1 on t3:
    #   d3 = 1 - 0.2 = 0.8                 A3 = 0.8
    #   d2 = 0.9*0.2 - 0.4 = -0.22         A2 = -0.22 + 0.72*0.8 = 0.356
    #   d1 = 0.9*0.4 - 0.5 = -0.14         A1 = -0.14 + 0.72*0.356 = 0.11632
    #   R = A + V = (0.61632, 0.756, 1.0)
    # Row 1: loss tokens t0, t2 (t1 is an env token: skipped), V = (0.3, _, 0.6), outcome 0.5 on t2:
    #   d2 = 0.5 - 0.6 = -0.1              A2 = -0.1
    #   d0 = 0.9*0.6 - 0.3 = 0.24          A0 = 0.24 + 0.72*(-0.1) = 0.168
    #   R = (0.468, 0.5)
    mask = torch.tensor([[0.0, 1, 1, 1], [1, 0, 1, 0]])
    values = torch.tensor([[NAN, 0.5, 0.4, 0.2], [0.3, 7.0, 0.6, 9.0]])
    inputs = AdvantageInputs(torch.tensor([1.0, 0.5]), mask, ["a", "b"], values=values)
    adv, ret = _run("gae", inputs, gamma=0.9, lambd=0.8)
    torch.testing.assert_close(
        adv, torch.tensor([[0.0, 0.11632, 0.356, 0.8], [0.168, 0, -0.1, 0]]), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        ret, torch.tensor([[0.0, 0.61632, 0.756, 1.0], [0.468, 0, 0.5, 0]]), rtol=0, atol=1e-6
    )


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        _run("gae", AdvantageInputs(REWARDS, MASK, UIDS))


def test_batch_whitening():
    # dr_grpo advantages (0.5, -0.5, 0, 1, -1) per sequence, on 2+3+2+2+1 = 10 tokens:
    # values 0.5 x2, -0.5 x3, 0 x2, 1 x2, -1 x1 -> sum 1 - 1.5 + 2 - 1 = 0.5, mean 0.05
    adv, _ = _run("dr_grpo", AdvantageInputs(REWARDS, MASK, UIDS), advantage_whitening=True)
    raw = [0.5] * 2 + [-0.5] * 3 + [0.0] * 2 + [1.0] * 2 + [-1.0]
    std = math.sqrt(sum((v - 0.05) ** 2 for v in raw) / 9) + 1e-8
    expected = _tokens([(v - 0.05) / std for v in (0.5, -0.5, 0.0, 1.0, -1.0)])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_shape_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r"\(5, 4\).*\(5, 3\)"):
        AdvantageInputs(REWARDS, MASK, UIDS, values=torch.zeros(5, 3))
    with pytest.raises(ValueError, match="rewards"):
        AdvantageInputs(torch.zeros(4), MASK, UIDS)
    with pytest.raises(ValueError, match="uids"):
        AdvantageInputs(REWARDS, MASK, UIDS[:4])


def test_unknown_estimator_lists_registered():
    with pytest.raises(KeyError, match="registered: dr_grpo, gae, grpo"):
        _run("nope", AdvantageInputs(REWARDS, MASK, UIDS))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
@pytest.mark.parametrize("whiten", [False, True])
def test_uniform_groups_get_exactly_zero(name, whiten):
    # Three groups of 8 samples, every reward in a group equal (0.7, 0.1, 0.3): score - group
    # mean is exactly 0, and whitening 0 is 0. In float32 the group mean of eight 0.7s is
    # 0.69999993 (one rounding step off 0.7), so std ~6e-8 and GRPO's (r - mean)/(std + 1e-6)
    # was ~0.056 on every sample; whitening turned such residues into about +-1.
    rewards = torch.tensor([0.7] * 8 + [0.1] * 8 + [0.3] * 8)
    uids = [u for u in "abc" for _ in range(8)]
    adv, _ = _run(
        name, AdvantageInputs(rewards, torch.ones(24, 3), uids), advantage_whitening=whiten
    )
    assert torch.equal(adv, torch.zeros(24, 3)), adv[:, 0]


def test_reinforce_pp_with_equal_returns_gets_exactly_zero():
    # every sequence's return is 0.1 on each of its tokens (gamma 1): whitened, all 0
    adv, _ = _run(
        "reinforce_pp", AdvantageInputs(torch.full((6,), 0.1), torch.ones(6, 5), ["a"] * 6)
    )
    assert torch.equal(adv, torch.zeros(6, 5)), adv
