"""``data=fake``'s rollout logprobs are the sampler's: response tokens drawn uniformly from the
vocabulary have log-probability -log(vocab_size) each (they were random draws that no
distribution gave, so ``algorithm.tis_cap`` weighted the policy loss by random ratios and
``rollout/logprob_abs_diff`` read ~6.6 on a fresh tiny model)."""

from __future__ import annotations

import math

import torch

from skyrl.workers.fake_rollouts import fake_rollouts


def test_rollout_logprobs_are_the_uniform_samplers():
    batch = fake_rollouts(4, 2, vocab_size=100, prompt_len=(3, 6), max_seq_len=48, seed=2)
    on = batch.loss_mask > 0
    # -log(100) = -4.605170...
    expected = torch.where(on, torch.tensor(-4.6051702), torch.tensor(0.0))
    torch.testing.assert_close(batch.rollout_logprobs, expected, rtol=0, atol=1e-6)


def test_step_wise_rows_carry_the_same_logprob_on_every_turn():
    batch = fake_rollouts(
        3, 2, vocab_size=7, prompt_len=(2, 4), max_seq_len=64, seed=5, step_wise=True, max_turns=3
    )
    values = set(batch.rollout_logprobs[batch.loss_mask > 0].tolist())
    assert len(values) == 1
    assert abs(values.pop() - (-math.log(7))) < 1e-6  # -1.9459...


def test_a_uniform_policy_gets_tis_weight_one():
    """A policy that is exactly uniform (what the sampler was) is on-policy: the TIS ratio
    exp(old - rollout) is 1 on every loss token (random logprobs gave ratios far from 1)."""
    batch = fake_rollouts(2, 2, vocab_size=50, prompt_len=(2, 4), max_seq_len=32, seed=0)
    old = torch.full_like(batch.rollout_logprobs, -math.log(50)) * batch.loss_mask
    ratio = torch.exp(old - batch.rollout_logprobs)[batch.loss_mask > 0]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-6)
