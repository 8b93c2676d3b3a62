"""A registered policy loss that returns something other than ``(loss, metrics)``: one line
naming ``algorithm.policy_loss`` and what it returned, at its first call
(``skyrl.workers.losses.policy_loss``), not an unpacking error inside the worker."""

from __future__ import annotations

import pytest
import torch

from skyrl.algorithms import POLICY_LOSSES
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.workers.losses import policy_loss

N, S = 2, 3
"""Rows and tokens of the micro batch."""


def rows() -> TrainingInputBatch:
    mask = torch.ones(N, S)
    tensors = dict(
        loss_mask=mask, loss_weights=mask / (N * S), advantages=torch.ones(N, S),
        old_logprobs=torch.full((N, S), -1.0),
    )  # fmt: skip
    return TrainingInputBatch(tensors)


def per_row(logprobs, *_args, **_kwargs):
    return (-logprobs).sum(-1), {}  # [N]: a loss per row


RETURNS = {  # the loss's return value, and how the error describes it
    "the loss alone": (lambda lp, *a, **k: (-lp).sum(), "a tensor of shape []"),
    "a float": (lambda lp, *a, **k: 0.5, "a float"),
    "a per-row loss": (per_row, "(a tensor of shape [2], a dict)"),
    "metrics first": (lambda lp, *a, **k: ({}, (-lp).sum()), "(a dict, a tensor of shape [])"),
}


@pytest.mark.parametrize("case", list(RETURNS))
def test_a_loss_returning_the_wrong_thing_is_one_line_naming_it(case):
    fn, described = RETURNS[case]
    name = f"bj_bad_{case.replace(' ', '_')}"
    POLICY_LOSSES.register(name, override=True)(fn)
    cfg = AlgorithmConfig(policy_loss=name, use_kl_loss=False)
    logprobs = torch.full((N, S), -1.0, requires_grad=True)
    with pytest.raises(TypeError) as err:
        policy_loss(logprobs, None, rows(), cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"algorithm.policy_loss={name} returned {described}; ")
    assert "(loss, metrics)" in message and "recipes/custom_loss/loss.py" in message


def test_a_loss_returning_loss_and_metrics_still_trains():
    # sum_t w_t * (-lp_t) = 6 tokens x (1/6) x 1.0 = 1.0
    name = "bj_good"
    POLICY_LOSSES.register(name, override=True)(
        lambda lp, old, adv, w, mask, cfg, rollout=None: (
            (-lp * w).sum(),
            {"loss_tokens": float(mask.sum())},
        )
    )
    cfg = AlgorithmConfig(policy_loss=name, use_kl_loss=False)
    loss, sums = policy_loss(torch.full((N, S), -1.0), None, rows(), cfg)
    assert loss.item() == pytest.approx(1.0, abs=1e-6)
    assert sums.loss_tokens == 6.0
