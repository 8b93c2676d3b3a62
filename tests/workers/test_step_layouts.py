"""One clipped step on dp 2 gives plain torch's update and reports torch's grad norm, at every
ZeRO stage that shards no weights and with gradient checkpointing on or off."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from worker_helpers import (
    LENGTHS,
    LR,
    MAX_SEQ_LEN,
    assert_weights_close,
    make_batch,
    make_config,
    one_mini_batch_chunks,
    row_logprobs,
)

from skyrl.algorithms.reductions import compute_loss_weights
from skyrl.workers.group import WorkerGroup

pytestmark = pytest.mark.slow

MAX_GRAD_NORM = 0.5
"""Below the tiny model's first gradient norm (8.87 on this batch): the clipping acts."""


def clipped_torch_step(model_path: str, batch) -> tuple[float, dict[str, torch.Tensor]]:
    """``clip_grad_norm_``'s total norm (before clipping) and the weights after one AdamW step."""
    from skyrl.algorithms import POLICY_LOSSES
    from skyrl.config.algorithm import AlgorithmConfig

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=1.0, weight_decay=0.0)
    weights = compute_loss_weights(
        "token_mean", batch.loss_mask, batch.metadata["uids"], MAX_SEQ_LEN
    )
    loss, _ = POLICY_LOSSES.get("ppo")(
        row_logprobs(model, batch), batch.old_logprobs, batch.advantages, weights,
        batch.loss_mask, AlgorithmConfig(),
    )  # fmt: skip
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    opt.step()
    return float(norm), {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.parametrize(
    ("zero_stage", "gradient_checkpointing"), [(0, True), (1, False), (2, True)]
)
def test_clipped_step_and_grad_norm_match_torch(
    ray_cluster, tiny_model_path, zero_stage, gradient_checkpointing
):
    batch = make_batch(tiny_model_path, ["a", "a", "b", "b"], LENGTHS)
    cfg = make_config(
        tiny_model_path,
        zero_stage=zero_stage,
        gradient_checkpointing=gradient_checkpointing,
        micro_batch_max_tokens=16,  # every sequence its own micro batch: 2 per rank
        **{"policy_optimizer.max_grad_norm": MAX_GRAD_NORM},
    )
    group = WorkerGroup("policy", cfg, total_optimizer_steps=10)
    try:
        checkpointing = group.get(
            [a.__ray_call__.remote(lambda w: w.engine.module.is_gradient_checkpointing)
             for a in group.actors]
        )  # fmt: skip
        assert checkpointing == [gradient_checkpointing] * 2
        chunks = one_mini_batch_chunks(batch)
        stats = group.train_mini_batch(chunks)
        norm, expected = clipped_torch_step(tiny_model_path, batch)
        assert norm > MAX_GRAD_NORM  # so the clipping did act
        assert not stats.nonfinite
        assert stats.grad_norm == pytest.approx(norm, rel=1e-6)
        assert_weights_close(group.run("state_dict_for_sync")[0], expected, atol=1e-6)
    finally:
        group.shutdown()
