"""The reference and critic roles on Ray: the reference forward is a plain transformers
forward; the critic trains one step on a staged mini-batch and its values move.

The critic's value head starts at zero, so its values before the step are 0 and its
first value loss is known in closed form: ``sum_t w_t * 1/2 * R_t^2``.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM
from worker_helpers import make_config as make_policy_config

from skyrl.algorithms import compute_loss_weights
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.dispatch import MeshDispatch
from skyrl.workers.group import WorkerGroup
from skyrl.workers.models import load_value_model

pytestmark = pytest.mark.slow

MAX_SEQ_LEN = 16  # max_prompt_length 4 + max_generate_length 12
PROMPT_LEN = 4
LENGTHS = [16, 9, 13, 6]
UIDS = ["a", "a", "b", "b"]


def make_config(model_path: str):
    return make_policy_config(
        model_path,
        critic_mini_batch_size=2,
        micro_batch_max_tokens=16,
        **{"critic_optimizer.lr": 0.01},
    )


def make_batch() -> TrainingInputBatch:
    gen = torch.Generator().manual_seed(11)
    n = len(LENGTHS)
    attention = torch.zeros(n, MAX_SEQ_LEN, dtype=torch.long)
    for i, length in enumerate(LENGTHS):
        attention[i, :length] = 1
    loss_mask = attention.float()
    loss_mask[:, :PROMPT_LEN] = 0
    ids = torch.randint(3, 200, (n, MAX_SEQ_LEN), generator=gen) * attention
    returns = torch.randn(n, MAX_SEQ_LEN, generator=gen) * loss_mask
    return TrainingInputBatch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "loss_mask": loss_mask,
            "values": torch.zeros(n, MAX_SEQ_LEN),  # the critic's (zero) values at rollout time
            "returns": returns,
        },
        {"uids": list(UIDS), "is_last_step": [True] * n},
    )


def stage(batch: TrainingInputBatch, dp_size: int = 2, with_weights: bool = False):
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], 2, 2)
    weights_fn = None
    if with_weights:

        def weights_fn(mb):
            return compute_loss_weights(
                "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
            )

    return MeshDispatch.stage_chunks(dp_size, batch, bounds, loss_weights_fn=weights_fn)


def plain_values(model_path: str, weights: dict[str, torch.Tensor], batch: TrainingInputBatch):
    """V(state before token t) at t from a padded in-process forward of the synced critic."""
    model = load_value_model(model_path, "fp32")
    model.load_state_dict(weights)
    with torch.no_grad():
        values = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    shifted = torch.cat([values.new_zeros(len(batch), 1), values[:, :-1]], dim=1)
    return shifted * batch.attention_mask


def test_reference_forward_equals_plain_transformers(ray_cluster, tiny_model_path):
    batch = make_batch()
    group = WorkerGroup("reference", make_config(tiny_model_path), total_optimizer_steps=1)
    try:
        logprobs = group.forward(stage(batch), len(batch))
    finally:
        group.shutdown()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    ids = batch.input_ids
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    expected = torch.cat([lp.new_zeros(len(batch), 1), lp], 1) * batch.loss_mask
    # reported at the loss tokens only (the LM head runs at their predictors), 0 elsewhere
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)


def test_critic_trains_one_step_and_its_values_change(ray_cluster, tiny_model_path):
    batch = make_batch()
    group = WorkerGroup("critic", make_config(tiny_model_path), total_optimizer_steps=10)
    try:
        before = group.forward(stage(batch), len(batch))
        assert torch.count_nonzero(before) == 0  # zero-initialised value head

        (chunks,) = stage(batch, with_weights=True)
        stats = group.train_mini_batch(chunks)

        after = group.forward(stage(batch), len(batch))
        weights = group.run("state_dict_for_sync")[0]
        assert group.run("global_steps") == [1, 1]
    finally:
        group.shutdown()

    weights_all = compute_loss_weights(
        "token_mean", batch.loss_mask, batch.metadata["uids"], MAX_SEQ_LEN
    )
    expected_loss = float((0.5 * weights_all * batch.returns**2).sum())
    assert math.isfinite(stats.losses.loss)
    assert stats.losses.loss == pytest.approx(expected_loss, rel=1e-5)
    assert stats.losses.loss_tokens == float(batch.loss_mask.sum())
    assert math.isfinite(stats.grad_norm) and stats.grad_norm > 0 and not stats.nonfinite

    real = batch.attention_mask.bool()
    real[:, 0] = False  # no state before the first token: value 0 by construction
    assert (after[real] - before[real]).abs().min() > 0, "some values did not move"
    assert torch.count_nonzero(after[:, 0]) == 0
    torch.testing.assert_close(
        after * batch.attention_mask,
        plain_values(tiny_model_path, weights, batch),
        atol=1e-5,
        rtol=0,
    )
