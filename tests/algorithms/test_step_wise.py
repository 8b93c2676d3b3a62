"""Step-wise advantages: last step's scalar broadcast to every turn (skyrl/algorithms/advantages/step_wise.py)."""

import math

import pytest
import torch

from skyrl.algorithms import AdvantageInputs, broadcast_last_step_advantages
from skyrl.config.algorithm import AlgorithmConfig

NAN = float("nan")
CFG = AlgorithmConfig(advantage_estimator="dr_grpo")

# trajectories: T0 = rows 0,1 (prompt p), T1 = row 2 (p), T2 = rows 3,4,5 (q), T3 = row 6 (q)
IS_LAST = [False, True, True, False, False, True, True]
UIDS = ["p", "p", "p", "q", "q", "q", "q"]
# only last steps carry a reward; NaN on the others must not matter
REWARDS = torch.tensor([NAN, 1.0, 0.0, NAN, NAN, 3.0, 1.0])
MASK = torch.tensor(
    [
        [0, 1, 1, 0],
        [0, 0, 1, 1],
        [1, 1, 1, 0],
        [0, 1, 0, 0],
        [0, 1, 1, 1],
        [0, 0, 0, 1],
        [1, 0, 1, 0],
    ],
    dtype=torch.float32,
)


def test_broadcast_from_last_steps():
    # last steps: p -> (1, 0), mean 0.5 -> (0.5, -0.5); q -> (3, 1), mean 2 -> (1, -1)
    # rows of T0 get 0.5, T1 -0.5, T2 1, T3 -1, on their own loss tokens
    adv, ret = broadcast_last_step_advantages(AdvantageInputs(REWARDS, MASK, UIDS), CFG, IS_LAST)
    expected = MASK * torch.tensor([0.5, 0.5, -0.5, 1, 1, 1, -1]).unsqueeze(1)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(ret, expected, rtol=0, atol=1e-7)


def test_explicit_trajectory_ids_interleaved():
    # same trajectories with rows interleaved: order 0, 3, 1, 4, 2, 5, 6
    order = [0, 3, 1, 4, 2, 5, 6]
    traj = [0, 0, 1, 2, 2, 2, 3]
    rows = torch.tensor(order)
    inputs = AdvantageInputs(REWARDS[rows], MASK[rows], [UIDS[i] for i in order])
    adv, _ = broadcast_last_step_advantages(
        inputs, CFG, [IS_LAST[i] for i in order], trajectory_ids=[traj[i] for i in order]
    )
    expected = MASK[rows] * torch.tensor([0.5, 0.5, -0.5, 1, 1, 1, -1])[rows].unsqueeze(1)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)


def test_bad_trajectories_raise():
    inputs = AdvantageInputs(REWARDS, MASK, UIDS)
    with pytest.raises(ValueError, match="last row"):
        broadcast_last_step_advantages(inputs, CFG, IS_LAST[:-1] + [False])
    with pytest.raises(ValueError, match="more than one"):
        broadcast_last_step_advantages(inputs, CFG, IS_LAST, trajectory_ids=[0, 0, 0, 1, 1, 1, 2])
    with pytest.raises(ValueError, match="without a last step"):
        broadcast_last_step_advantages(inputs, CFG, IS_LAST, trajectory_ids=[0, 0, 1, 2, 9, 2, 3])


def test_kl_in_reward_of_every_turn_counts():
    # Two 2-turn trajectories of prompt p, outcome 1 each. A's first turn carries a KL penalty
    # of -0.25 on each of its 2 tokens (-0.5 in all), B none: scores A 0.5, B 1.0, mean 0.75,
    # so dr_grpo gives A -0.25 and B +0.25 on every turn (only the last turn's penalty counted
    # before: both 1.0, both 0).
    token_rewards = torch.zeros(4, 2)
    token_rewards[0] = -0.25
    inputs = AdvantageInputs(
        torch.tensor([NAN, 1.0, NAN, 1.0]), torch.ones(4, 2), ["p"] * 4, token_rewards=token_rewards
    )
    adv, _ = broadcast_last_step_advantages(inputs, CFG, [False, True, False, True])
    expected = torch.tensor([-0.25, -0.25, 0.25, 0.25]).unsqueeze(1).expand(4, 2)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize(
    "cfg",
    [
        AlgorithmConfig(advantage_estimator="dr_grpo", advantage_whitening=True),
        AlgorithmConfig(advantage_estimator="reinforce_pp_baseline"),
    ],
    ids=["dr_grpo+whitening", "reinforce_pp_baseline"],
)
def test_whitening_covers_every_turns_tokens(cfg):
    # T0 = rows 0,1 (p, reward 1), T1 = row 2 (p, reward 0): centred scalars 0.5, 0.5, -0.5.
    # Trained tokens: row 0 has 3, row 1 has 1, row 2 has 2 -> values 0.5 x4, -0.5 x2,
    # mean 1/6, unbiased var (4 (1/3)^2 + 2 (2/3)^2) / 5 = (4/9 + 8/9) / 5 = 4/15.
    # Whitened over the last steps' tokens only (before), the trained tokens were not mean 0.
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 1, 0]])
    inputs = AdvantageInputs(torch.tensor([NAN, 1.0, 0.0]), mask, ["p"] * 3)
    adv, _ = broadcast_last_step_advantages(inputs, cfg, [False, True, True])
    std = math.sqrt(4 / 15) + 1e-8
    expected = mask * ((torch.tensor([0.5, 0.5, -0.5]) - 1 / 6) / std).unsqueeze(1)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    trained = adv[mask > 0]
    assert abs(trained.mean().item()) < 1e-6 and abs(trained.std().item() - 1) < 1e-6
