"""The worker counts a micro batch's loss tokens from its ``loss_mask`` itself, whatever the
registered policy loss reports in its metrics.

A custom loss may return ``(loss, {})``: the metrics dict is optional. The KL and entropy
sums the worker adds are over the loss tokens, and ``skyrl.trainer.step_stats`` divides them
by ``LossSums.loss_tokens``: taken from the loss's (absent) ``loss_tokens``, that was 0, so
``policy/loss_tokens`` logged 0 and ``policy/entropy`` / ``policy/kl`` logged sums over the
mini-batch's tokens as if they were token means (a smoke run: entropy 235.7 over 48 tokens,
i.e. 4.91 nats per token).
"""

from __future__ import annotations

import pytest
import torch

from skyrl.algorithms import POLICY_LOSSES
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.tracking.metric_names import POLICY
from skyrl.trainer.step_stats import step_metrics
from skyrl.workers.losses import policy_loss
from skyrl.workers.stats import PackingStats, TrainStats

NAME = "no_metrics_pg_s51"


@pytest.fixture(scope="module", autouse=True)
def no_metrics_loss():
    @POLICY_LOSSES.register(NAME, override=True)
    def no_metrics_pg(
        logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg, rollout=None
    ):
        """REINFORCE with no metrics at all."""
        return torch.where(loss_mask > 0, -advantages * logprobs * loss_weights, 0.0).sum(), {}

    yield


def rows_and_outputs():
    # 2 rows of 4 positions; loss tokens: row 0 at 1, 2, 3; row 1 at 2 -> 4 loss tokens
    loss_mask = torch.tensor([[0.0, 1, 1, 1], [0.0, 0, 1, 0]])
    weights = loss_mask / 4  # token_mean over the mini-batch's 4 loss tokens
    logprobs = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -3.0, -1.5, -9.0]], requires_grad=True)
    ref_logprobs = torch.tensor([[0.0, -1.5, -2.0, -0.5], [0.0, -1.0, -0.5, -1.0]])
    entropy = torch.tensor([[7.0, 1.0, 2.0, 3.0], [7.0, 7.0, 4.0, 7.0]])
    rows = TrainingInputBatch(
        {
            "input_ids": torch.ones(2, 4, dtype=torch.long),
            "attention_mask": torch.ones(2, 4, dtype=torch.long),
            "loss_mask": loss_mask,
            "loss_weights": weights,
            "advantages": torch.ones(2, 4) * loss_mask,
            "old_logprobs": logprobs.detach() * loss_mask,
            "ref_logprobs": ref_logprobs,
        }
    )
    return logprobs, entropy, rows


def test_a_loss_without_metrics_still_gives_token_means():
    cfg = AlgorithmConfig(policy_loss=NAME, use_kl_loss=True, kl_estimator="k1", entropy_coef=0.1)
    logprobs, entropy, rows = rows_and_outputs()
    loss, sums = policy_loss(logprobs, entropy, rows, cfg)
    assert sums.loss_tokens == 4.0
    # entropy over the 4 loss tokens: (1 + 2 + 3 + 4) / 4 = 2.5
    assert sums.token_mean("entropy") == pytest.approx(2.5, abs=1e-6)
    # k1 = logprob - ref on loss tokens: 0.5 + 0 + 0 + (-1.5 + 0.5 = -1.0) -> -0.5 / 4
    assert sums.token_mean("kl") == pytest.approx(-0.125, abs=1e-6)
    record = TrainStats(
        losses=sums, grad_norm=1.0, lr=1e-3, nonfinite=False, compute_s=0.0,
        packing=PackingStats(*[1.0] * 8),
    )  # fmt: skip
    metrics = step_metrics(POLICY, [record])
    assert metrics[POLICY.loss_tokens] == 4.0
    assert metrics[POLICY.token_mean("entropy")] == pytest.approx(2.5, abs=1e-6)
    # the loss: policy sum w (-A lp) = (1 + 2 + 0.5 + 1.5) / 4 = 1.25, plus kl_loss_coef 0.001 x
    # the KL term -0.5 / 4, minus entropy_coef 0.1 x the entropy bonus 10 / 4
    assert float(loss.detach()) == pytest.approx(1.25 + 0.001 * -0.125 - 0.1 * 2.5, abs=1e-6)


def test_a_built_in_loss_counts_the_same_tokens():
    cfg = AlgorithmConfig(policy_loss="ppo", use_kl_loss=True, kl_estimator="k1", entropy_coef=0.1)
    logprobs, entropy, rows = rows_and_outputs()
    _, sums = policy_loss(logprobs, entropy, rows, cfg)
    assert sums.loss_tokens == 4.0
    assert sums.token_mean("entropy") == pytest.approx(2.5, abs=1e-6)
