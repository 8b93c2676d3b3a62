"""Clipped critic loss (skyrl/algorithms/value_loss.py)."""

import pytest
import torch

from skyrl.algorithms import value_loss

NAN = float("nan")
# t0: V 1.0, V_old 0.9, R 1.5: V - V_old = 0.1 inside 0.2 -> both (1-1.5)^2 = 0.25 -> 0.125
# t1: V 0.5, V_old 0.5, R 0.0: 0.25 -> 0.125
# t2: V 1.3, V_old 1.0, R 2.0: unclipped 0.49, V_clip 1.2 -> 0.64 -> max 0.64 -> 0.32 (clip used)
# t3: masked, NaN
VALUES = torch.tensor([[1.0, 0.5, 1.3, NAN]])
OLD = torch.tensor([[0.9, 0.5, 1.0, NAN]])
RETURNS = torch.tensor([[1.5, 0.0, 2.0, NAN]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def test_clipped_value_loss():
    values = VALUES.clone().requires_grad_()
    loss, metrics = value_loss(values, OLD, RETURNS, MASK, MASK, value_clip=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.125 + 0.125 + 0.32, abs=1e-6)
    # gradients: V - R on unclipped tokens (-0.5, 0.5); 0 where the clipped branch wins; 0 off the mask
    torch.testing.assert_close(
        values.grad, torch.tensor([[-0.5, 0.5, 0.0, 0.0]]), rtol=0, atol=1e-6
    )
    assert metrics["vf_clip_tokens"] == 1 and metrics["loss_tokens"] == 3
    assert metrics["value_error_sum"] == pytest.approx(0.25 + 0.25 + 0.49, abs=1e-6)


def test_value_clip_off():
    # 0.5 * (0.25 + 0.25 + 0.49) = 0.495
    loss, metrics = value_loss(VALUES, OLD, RETURNS, MASK, MASK, value_clip=0.0)
    assert loss.item() == pytest.approx(0.495, abs=1e-6)
    assert metrics["vf_clip_tokens"] == 0


def test_fully_masked_and_shapes():
    zeros = torch.zeros(1, 4)
    loss, _ = value_loss(VALUES, OLD, RETURNS, zeros, zeros, value_clip=0.2)
    assert loss.item() == 0.0
    with pytest.raises(ValueError, match=r"returns=\(1, 3\)"):
        value_loss(VALUES, OLD, RETURNS[:, :3], MASK, MASK, value_clip=0.2)


def test_values_inside_the_clip_range_are_never_counted_clipped():
    # V 0.01, V_old 0.06, R 0: |V - V_old| = 0.05 < 0.2, so V_clip = V and nothing is clipped:
    # loss 0.5 * 0.01^2 = 5e-5, gradient V - R = 0.01. In float32 V_old + (V - V_old) lands
    # one ulp farther from R than V, which counted the token as clipped.
    values = torch.tensor([[0.01]], requires_grad=True)
    ones = torch.ones(1, 1)
    loss, metrics = value_loss(values, torch.tensor([[0.06]]), torch.zeros(1, 1), ones, ones, 0.2)
    loss.backward()
    assert metrics["vf_clip_tokens"] == 0
    assert loss.item() == pytest.approx(5e-5, rel=1e-6)
    assert values.grad.item() == pytest.approx(0.01, rel=1e-6)
