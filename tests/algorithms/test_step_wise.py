"""Step-wise advantages: last step's scalar broadcast to every turn (skyrl/algorithms/advantages/step_wise.py)."""

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
