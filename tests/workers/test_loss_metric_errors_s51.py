"""A registered policy loss whose metrics break the additive convention is one error naming
``algorithm.policy_loss`` and the metric: a verl-style fraction (``clipfrac``) said which
metric but not which configured part returned it, and a metric that is no number (a per-row
tensor) was torch's own "a Tensor with 3 elements cannot be converted to Scalar"."""

from __future__ import annotations

import pytest
import torch

from skyrl.algorithms import POLICY_LOSSES
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.workers.losses import policy_loss

METRICS = {
    "fraction_pg_s51": {"clipfrac": 0.25},
    "per_row_pg_s51": {"loss_tokens": 3.0, "clip_tokens": torch.ones(3)},
}


@pytest.fixture(scope="module", autouse=True)
def losses():
    for name, metrics in METRICS.items():

        def loss_fn(logprobs, old, advantages, weights, mask, cfg, rollout=None, metrics=metrics):
            return (-advantages * logprobs * weights).sum(), dict(metrics)

        POLICY_LOSSES.register(name, override=True)(loss_fn)
    yield


def rows() -> TrainingInputBatch:
    mask = torch.tensor([[0.0, 1, 1, 1]])
    return TrainingInputBatch(
        {
            "input_ids": torch.ones(1, 4, dtype=torch.long),
            "attention_mask": torch.ones(1, 4, dtype=torch.long),
            "loss_mask": mask,
            "loss_weights": mask / 3,
            "advantages": mask.clone(),
            "old_logprobs": torch.zeros(1, 4),
        }
    )


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("fraction_pg_s51", "loss metric 'clipfrac' is neither a token count"),
        ("per_row_pg_s51", "loss metric 'clip_tokens' is a tensor of shape [3], not a number"),
    ],
)
def test_a_metric_off_the_convention_names_the_loss_and_the_metric(name, said):
    logprobs = torch.full((1, 4), -1.0, requires_grad=True)
    with pytest.raises(TypeError) as raised:
        policy_loss(logprobs, None, rows(), AlgorithmConfig(policy_loss=name))
    message = str(raised.value)
    assert message.startswith(f"algorithm.policy_loss={name}: ")
    assert said in message
    assert "\n" not in message
