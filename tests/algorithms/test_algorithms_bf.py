"""A recipe's registered estimator returning the wrong thing is refused with its name
(``kl.masked_kl``, ``advantages.compute``); step-wise advantages are the last step's exact
scalar (``advantages.step_wise``)."""

import pytest
import torch

from skyrl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    AdvantageInputs,
    broadcast_last_step_advantages,
    compute_advantages,
    masked_kl,
)
from skyrl.algorithms.advantages import broadcast_to_tokens
from skyrl.config.algorithm import AlgorithmConfig


def mean_kl(logprobs, ref_logprobs):
    """A recipe's mistake: the batch mean, not one value per token."""
    return (logprobs - ref_logprobs).mean()


def advantages_only(inputs, cfg):
    """A recipe's mistake: the advantages alone, without the returns."""
    return torch.ones(inputs.loss_mask.shape)


def plain_reward(inputs, cfg):
    """A recipe's estimator without a baseline: A = the sequence score on every loss token."""
    adv = broadcast_to_tokens(inputs.sequence_rewards(), inputs.loss_mask)
    return adv, adv


@pytest.fixture(autouse=True)
def recipe_parts(monkeypatch):
    """Register the recipe functions above for one test only: other tests list the registries."""
    for registry, name, fn in (
        (KL_ESTIMATORS, "test_bf_mean_kl", mean_kl),
        (ADVANTAGE_ESTIMATORS, "test_bf_advantages_only", advantages_only),
        (ADVANTAGE_ESTIMATORS, "test_bf_plain_reward", plain_reward),
    ):
        monkeypatch.setitem(registry._entries, name, fn)


def test_kl_estimator_returning_a_scalar_is_refused():
    # before: the scalar broadcast to every loss token. The masked inputs are
    # (-1, -2, 0 | -1, 0, 0) against ref 0, so every loss token got the mean -4/6 = -0.667
    # instead of its own k1 (-1, -2 | -1)
    logprobs = torch.tensor([[-1.0, -2.0, 5.0], [-1.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    with pytest.raises(ValueError) as err:
        masked_kl("test_bf_mean_kl", logprobs, torch.zeros(2, 3), mask)
    assert str(err.value) == (
        "KL estimator 'test_bf_mean_kl' returned shape (), expected one value per token "
        "(2, 3) (the shape of logprobs)"
    )


def test_builtin_kl_estimator_still_per_token():
    logprobs = torch.tensor([[-1.0, -2.0, 5.0], [-1.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    kl = masked_kl("k1", logprobs, torch.zeros(2, 3), mask)  # log pi - log pi_ref on the mask
    assert torch.equal(kl, torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]]))


@pytest.mark.parametrize("batch", [2, 3])
def test_estimator_returning_one_tensor_is_refused(batch):
    # before: batch 3 raised "too many values to unpack (expected 2)" naming nothing; batch 2
    # unpacked the [2, 4] tensor into its two rows and blamed a shape (4,)
    inputs = AdvantageInputs(torch.ones(batch), torch.ones(batch, 4), ["a"] * batch)
    cfg = AlgorithmConfig(advantage_estimator="test_bf_advantages_only")
    with pytest.raises(ValueError) as err:
        compute_advantages(inputs, cfg)
    assert str(err.value) == (
        "estimator 'test_bf_advantages_only' must return (advantages, returns), both of shape "
        f"({batch}, 4); it returned one tensor of shape ({batch}, 4)"
    )


def test_step_wise_whitening_of_equal_advantages_is_exactly_zero():
    # Four one-step trajectories, all rewarded 0.7, with 3, 5, 7 and 6 loss tokens: every
    # advantage is 0.7, so whitening over the batch gives (0.7 - 0.7) / (0 + 1e-8) = 0, as the
    # whole-trajectory path gives. Before: the last step's scalar was a float32 token mean,
    # 0.7 * 7 / 7 = 0.69999993 for the 7-token row, and whitening made that one rounding step
    # into advantages of +0.51 / -1.02.
    mask = torch.zeros(4, 8)
    for row, length in enumerate((3, 5, 7, 6)):
        mask[row, :length] = 1.0
    inputs = AdvantageInputs(torch.full((4,), 0.7), mask, ["a", "a", "b", "b"])
    cfg = AlgorithmConfig(advantage_estimator="test_bf_plain_reward", advantage_whitening=True)
    adv, _ = broadcast_last_step_advantages(inputs, cfg, [True] * 4)
    assert torch.equal(adv, torch.zeros(4, 8))
    whole, _ = compute_advantages(inputs, cfg)
    assert torch.equal(whole, torch.zeros(4, 8))


def test_step_wise_one_step_trajectories_match_whole_trajectories_exactly():
    # GRPO, one step per trajectory: the broadcast scalar is the row's own constant advantage,
    # so both paths must give the same float32 values bit for bit (before: 6e-8 apart).
    # rewards (0, 0.1, 0.2): mean 0.1, unbiased std sqrt((0.01 + 0 + 0.01) / 2) = 0.1, so
    # A = (-0.1, 0, 0.1) / (0.1 + 1e-6) = (-0.99999, 0, 0.99999)
    mask = torch.zeros(3, 9)
    for row, length in enumerate((7, 3, 9)):
        mask[row, :length] = 1.0
    inputs = AdvantageInputs(torch.tensor([0.0, 0.1, 0.2]), mask, ["a", "a", "a"])
    cfg = AlgorithmConfig(advantage_estimator="grpo")
    stepwise, _ = broadcast_last_step_advantages(inputs, cfg, [True] * 3)
    whole, _ = compute_advantages(inputs, cfg)
    assert torch.equal(stepwise, whole)
    a = 0.1 / (0.1 + 1e-6)
    torch.testing.assert_close(stepwise[:, 0], torch.tensor([-a, 0.0, a]), rtol=0, atol=1e-6)
