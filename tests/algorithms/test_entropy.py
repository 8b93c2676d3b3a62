"""Chunked entropy from logits and the entropy bonus (skyrl/algorithms/entropy.py)."""

import math

import pytest
import torch

from skyrl.algorithms import entropy_bonus, entropy_from_logits


def _reference(logits):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_known_values():
    # uniform over 2: ln 2; p = (1/4, 3/4): -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351446; uniform over 4 would be ln 4
    logits = torch.tensor([[[0.0, 0.0, -1e9], [0.0, math.log(3.0), -1e9], [5.0, 5.0, 5.0]]])
    expected = torch.tensor([[math.log(2), 0.5623351446, math.log(3)]])
    torch.testing.assert_close(
        entropy_from_logits(logits, chunk_size=2), expected, rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_chunking_matches_reference_values_and_gradients(chunk_size):
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0), requires_grad=True)
    weights = torch.rand(2, 5, generator=torch.Generator().manual_seed(1))
    out = entropy_from_logits(logits, chunk_size=chunk_size)
    (grad,) = torch.autograd.grad((out * weights).sum(), logits)
    ref = _reference(logits)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-6)


def test_bf16_logits_and_bonus():
    logits = torch.zeros(1, 2, 4, dtype=torch.bfloat16)
    h = entropy_from_logits(logits)
    assert h.dtype == torch.float32
    # weights (0.5, 0.5) on both tokens of entropy ln 4 -> ln 4; a masked NaN entropy does not leak
    h = torch.tensor([[math.log(4), float("nan")]])
    mask = torch.tensor([[1.0, 0.0]])
    assert entropy_bonus(h, torch.tensor([[1.0, 0.0]]), mask).item() == pytest.approx(
        math.log(4), abs=1e-6
    )


def test_minus_inf_logits_have_zero_probability():
    # A -inf logit (a masked vocabulary entry) has p = 0 and adds nothing to H = -sum p log p:
    # (0, 0, -inf, -inf) -> uniform over 2: ln 2 = 0.6931471806
    # (0, ln 3, -inf, -inf) -> p = (1/4, 3/4): -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351446
    # Before: softmax(-inf) * -inf = 0 * -inf = NaN.
    # The gradient equals that of the finite entries alone, and is 0 at the -inf ones.
    inf = math.inf
    logits = torch.tensor([[0.0, 0.0, -inf, -inf], [0.0, math.log(3.0), -inf, -inf]])
    logits.requires_grad_()
    out = entropy_from_logits(logits, chunk_size=1)
    torch.testing.assert_close(out, torch.tensor([math.log(2), 0.5623351446]), rtol=0, atol=1e-6)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    finite = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]], requires_grad=True)
    (finite_grad,) = torch.autograd.grad(_reference(finite).sum(), finite)
    torch.testing.assert_close(grad[:, :2], finite_grad, rtol=0, atol=1e-6)
    assert torch.equal(grad[:, 2:], torch.zeros(2, 2))
