"""Inputs the algorithm parts get from a recipe or a custom driver: integer advantages are
whitened as numbers, not truncated (``advantages.groups.masked_whiten``); a list where a tensor
belongs, a tensor of uids (every row its own group) and a reduction returning no tensor are
refused with one line naming them (``shapes``, ``advantages``, ``reductions``)."""

import pytest
import torch

from skyrl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    LOSS_REDUCTIONS,
    POLICY_LOSSES,
    AdvantageInputs,
    compute_advantages,
    compute_loss_weights,
    masked_whiten,
)
from skyrl.config.algorithm import AlgorithmConfig


def integer_ranks(inputs, cfg):
    """A recipe's estimator returning integer advantages: rank 1, 2, 3 of each row."""
    ranks = torch.arange(1, len(inputs.uids) + 1).unsqueeze(1)
    adv = ranks * (inputs.loss_mask > 0).long()
    return adv, adv


def scalar_weight(loss_mask, uids, max_seq_len):
    """A recipe's mistake: one Python float for every token, not a [B, S] tensor."""
    return 1.0 / float(loss_mask.sum())


@pytest.fixture(autouse=True)
def recipe_parts(monkeypatch):
    """Register the recipe functions above for one test only: other tests list the registries."""
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS._entries, "test_bv_integer_ranks", integer_ranks)
    monkeypatch.setitem(LOSS_REDUCTIONS._entries, "test_bv_scalar_weight", scalar_weight)


def test_whitening_integer_advantages_keeps_the_fractions():
    # before: masked_whiten cast back to int64, so +-1.118 became +-1 (and 1, 2, 3 in one
    # row became 0, 0, 0). Rows 1, 2, 3 on two loss tokens each: mean 2, deviations
    # -1 -1 0 0 1 1, sum of squares 4, unbiased var 4 / 5 = 0.8, std 0.894427;
    # 1 / 0.894427 = 1.118034
    cfg = AlgorithmConfig(advantage_estimator="test_bv_integer_ranks", advantage_whitening=True)
    inputs = AdvantageInputs(torch.zeros(3), torch.ones(3, 2), ["a", "b", "c"])
    adv, ret = compute_advantages(inputs, cfg)
    a = 1.118034
    expected = torch.tensor([[-a, -a], [0.0, 0.0], [a, a]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    # returns are not whitened: the integer ranks, as float32
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]))


def test_masked_whiten_of_integers_is_float32():
    # 1 2 3 (and a masked 9): mean 2, unbiased var (1 + 0 + 1) / 2 = 1, std 1 (+1e-8)
    out = masked_whiten(torch.tensor([[1, 2, 3, 9]]), torch.tensor([[1, 1, 1, 0]]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), rtol=0, atol=1e-7)


def test_rewards_as_a_list_are_refused_by_name():
    # before: AttributeError: 'list' object has no attribute 'shape'
    with pytest.raises(TypeError) as err:
        AdvantageInputs([1.0, 0.0], torch.ones(2, 3), ["a", "a"])
    assert str(err.value) == "rewards must be a torch.Tensor [B], got list"


def test_policy_loss_argument_as_a_list_is_refused_by_name():
    # before: AttributeError: 'list' object has no attribute 'shape'
    ones = torch.ones(1, 2)
    with pytest.raises(TypeError) as err:
        POLICY_LOSSES.get("ppo")(ones, ones, [[1.0, 1.0]], ones, ones, AlgorithmConfig())
    assert str(err.value) == "advantages must be a torch.Tensor [B, S], got list"


def test_reduction_returning_no_tensor_is_refused_by_name():
    # before: AttributeError: 'float' object has no attribute 'shape'
    with pytest.raises(ValueError) as err:
        compute_loss_weights("test_bv_scalar_weight", torch.ones(2, 3), ["a", "b"], 3)
    assert str(err.value) == (
        "loss reduction 'test_bv_scalar_weight' returned float, expected a tensor of shape "
        "(2, 3) (one weight per token)"
    )


def test_loss_mask_as_a_list_is_refused_by_name():
    with pytest.raises(TypeError) as err:
        compute_loss_weights("token_mean", [[1, 1]], ["a"], 2)
    assert str(err.value) == "loss_mask must be a torch.Tensor [B, S], got list"


def test_uids_as_a_tensor_are_refused():
    # before: tensor elements hash by identity, so rows 0, 1 (prompt 0) and 2, 3 (prompt 1)
    # were four groups of one and every GRPO advantage was 0 instead of about +-0.7071
    # (rewards 1, 0 per prompt: mean 0.5, unbiased std 0.7071, 0.5 / (0.7071 + 1e-6))
    uids = torch.tensor([0, 0, 1, 1])
    message = (
        "uids must be a list of prompt ids, one per row, got a torch.Tensor (its elements "
        "never compare equal as ids); pass uids.tolist()"
    )
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.ones(4, 2), uids)
    with pytest.raises(TypeError) as err:
        compute_advantages(inputs, AlgorithmConfig())
    assert str(err.value) == message
    with pytest.raises(TypeError) as err:
        compute_loss_weights("prompt_mean", torch.ones(4, 2), uids, 2)
    assert str(err.value) == message
    as_list = AdvantageInputs(inputs.rewards, inputs.loss_mask, uids.tolist())
    adv, _ = compute_advantages(as_list, AlgorithmConfig())
    a = 0.5 / (0.5**0.5 + 1e-6)  # the GRPO eps: 0.7071054
    torch.testing.assert_close(adv[:, 0], torch.tensor([a, -a, a, -a]), rtol=0, atol=1e-7)
