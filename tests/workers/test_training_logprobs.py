"""An on-policy step without the separate old-logprob forward (``skyrl.trainer.on_policy``)
takes the same update as the two-pass path, and returns the training forward's logprobs as
the old ones; the worker's checks on its training pass: dropout that would make the training
forward differ from the no-grad one, a non-finite gradient entry (one fused norm)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM
from worker_helpers import LENGTHS, MAX_SEQ_LEN, assert_weights_close, make_batch, make_config

from skyrl.algorithms.reductions import compute_loss_weights
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.dispatch import MeshDispatch
from skyrl.workers.group import WorkerGroup
from skyrl.workers.worker import OLD_LOGPROBS_FROM_TRAINING, TrainingWorker

pytestmark = pytest.mark.slow


def stage(batch: TrainingInputBatch, loss_weights: bool = True):
    uids = batch.metadata["uids"]
    bounds = compute_prompt_mini_batch_boundaries(uids, len(set(uids)), len(set(uids)))
    return MeshDispatch.stage_chunks(
        2,
        batch,
        bounds,
        loss_weights_fn=(
            (lambda mb: compute_loss_weights("token_mean", mb.loss_mask, mb.metadata["uids"], 16))
            if loss_weights
            else None
        ),
    )


@pytest.fixture(scope="module")
def group(ray_cluster, tiny_model_path, tmp_path_factory):
    """dp 2, ZeRO-0, a 10-token budget (several micro batches per rank), PPO clip 0.2."""
    cfg = make_config(tiny_model_path, micro_batch_max_tokens=10)
    group = WorkerGroup("policy", cfg, total_optimizer_steps=10)
    init_dir = tmp_path_factory.mktemp("init_ckpt")
    group.run("save_checkpoint", str(init_dir))
    yield group, str(init_dir)
    group.shutdown()


@pytest.mark.parametrize(
    ("uids", "lengths"),
    [
        (["a", "a", "b", "b"], LENGTHS),
        (["a", "a", "a"], LENGTHS[:3]),  # 3 rows on 2 ranks: one zero-loss padding row
    ],
)
def test_on_policy_step_equals_the_two_pass_step(group, tiny_model_path, uids, lengths):
    group, init_dir = group
    data = make_batch(tiny_model_path, uids, lengths).replace(old_logprobs=None)
    mask = data.loss_mask
    # two passes: the no-grad forward gives the old logprobs, then the training step
    group.run("load_checkpoint", init_dir)
    old = group.forward(stage(data, loss_weights=False), len(data)) * mask
    (chunks,) = stage(data.replace(old_logprobs=old))
    two_pass = group.train_mini_batch(chunks)
    expected = group.run("state_dict_for_sync")[0]
    # one pass: no old logprobs in the batch; the training forward's are used and returned
    group.run("load_checkpoint", init_dir)
    flagged = TrainingInputBatch(data.tensors, {**data.metadata, OLD_LOGPROBS_FROM_TRAINING: True})
    returned = torch.zeros_like(mask)
    (chunks,) = stage(flagged)
    one_pass = group.train_mini_batch(chunks, logprobs_into=returned)
    assert_weights_close(group.run("state_dict_for_sync")[0], expected, atol=0.0)
    torch.testing.assert_close(returned * mask, old, atol=0.0, rtol=0)
    assert one_pass.losses.loss == pytest.approx(two_pass.losses.loss, abs=1e-7)
    assert one_pass.grad_norm == pytest.approx(two_pass.grad_norm, rel=1e-6)
    # ratio exactly 1 on every token: nothing clipped, approx KL exactly 0
    assert one_pass.losses.flag_tokens.get("clip", 0.0) == 0.0
    assert one_pass.losses.token_sums.get("approx_kl", 0.0) == 0.0


def test_a_chunk_not_staged_as_on_policy_returns_no_logprobs(group, tiny_model_path):
    group, init_dir = group
    group.run("load_checkpoint", init_dir)
    (chunks,) = stage(make_batch(tiny_model_path, ["a", "a"], LENGTHS[:2]))
    with pytest.raises(RuntimeError, match="no training logprobs"):
        group.train_mini_batch(chunks, logprobs_into=torch.zeros(2, MAX_SEQ_LEN))


def active_dropout(model: torch.nn.Module) -> list[str]:
    """``TrainingWorker.active_dropout`` on a bare model (no DeepSpeed engine needed)."""
    return TrainingWorker.active_dropout(SimpleNamespace(engine=SimpleNamespace(module=model)))


def test_dropout_in_the_model_or_its_adapters_is_found(tiny_model_path):
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    assert active_dropout(model) == []  # the tiny Qwen2: attention_dropout 0.0
    model.config.attention_dropout = 0.1
    assert active_dropout(model) == ["config.attention_dropout=0.1"]
    model.config.attention_dropout = 0.0
    model.config.router_jitter_noise = 0.1  # Mixtral-style MoE: noise in train mode only
    assert active_dropout(model) == ["config.router_jitter_noise=0.1"]
    model.config.router_jitter_noise = 0.0
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], lora_dropout=0.05))
    found = active_dropout(lora)
    assert found and all("lora_dropout" in f and "p=0.05" in f for f in found)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_non_finite_gradient_entry_is_found(tiny_model_path, bad):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    worker = SimpleNamespace(
        engine=SimpleNamespace(module=model),
        cfg=SimpleNamespace(trainer=SimpleNamespace(zero_stage=0)),
    )
    assert TrainingWorker._local_grads_finite(worker)
    last = list(model.parameters())[-1]
    last.grad[0] = bad
    assert not TrainingWorker._local_grads_finite(worker)
