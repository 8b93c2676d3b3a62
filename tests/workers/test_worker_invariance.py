"""DeepSpeed workers on Ray give the update of one plain torch step, whatever the layout.

A single-process reference (plain transformers forward on padded rows, torch
AdamW) is compared with worker groups that differ in dp_size, ZeRO stage,
micro-batch budget and padding. AdamW runs with eps=1.0 so that the first
update is ~lr x gradient and thus sensitive to the loss SCALE (with the usual
eps=1e-8 Adam's first step is ~lr x sign(grad), blind to a wrong dp_size factor).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from worker_helpers import (
    LENGTHS,
    LR,
    MAX_SEQ_LEN,
    PROMPT_LEN,
    assert_weights_close,
    make_batch,
    make_config,
    row_logprobs,
)

from skyrl.algorithms.reductions import compute_loss_weights
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.dispatch import MeshDispatch
from skyrl.inference.hf import HFEngine
from skyrl.models import build_tiny_model
from skyrl.tracking.metric_names import POLICY
from skyrl.trainer.step_stats import step_metrics
from skyrl.trainer.weight_sync import BroadcastWeightSync
from skyrl.workers.group import WorkerGroup

pytestmark = pytest.mark.slow


def reference_weights(
    model_path: str, batch: TrainingInputBatch, reduction: str
) -> dict[str, torch.Tensor]:
    from skyrl.algorithms import POLICY_LOSSES
    from skyrl.config.algorithm import AlgorithmConfig

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=1.0, weight_decay=0.0)
    weights = compute_loss_weights(reduction, batch.loss_mask, batch.metadata["uids"], MAX_SEQ_LEN)
    loss, _ = POLICY_LOSSES.get("ppo")(
        row_logprobs(model, batch),
        batch.old_logprobs,
        batch.advantages,
        weights,
        batch.loss_mask,
        AlgorithmConfig(),
    )
    loss.backward()
    opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def train_one_step(
    group: WorkerGroup,
    batch: TrainingInputBatch,
    reduction: str,
    dp_size: int,
    train_batch_size: int,
):
    uids = batch.metadata["uids"]
    bounds = compute_prompt_mini_batch_boundaries(uids, train_batch_size, train_batch_size)
    staged = MeshDispatch.stage_chunks(
        dp_size,
        batch,
        bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            reduction, mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )
    (chunks,) = staged
    return group.train_mini_batch(chunks)


def stage_mini_batches(batch: TrainingInputBatch, reduction: str, mini_batch_size: int):
    uids = batch.metadata["uids"]
    bounds = compute_prompt_mini_batch_boundaries(uids, mini_batch_size, len(set(uids)))
    return MeshDispatch.stage_chunks(
        2,
        batch,
        bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            reduction, mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )


@pytest.fixture(scope="module")
def batch(tiny_model_path):
    return make_batch(tiny_model_path, ["a", "a", "b", "b"], LENGTHS)


@pytest.fixture(scope="module")
def dp2_small_micro(ray_cluster, tiny_model_path, tmp_path_factory):
    """dp 2, ZeRO-0, a 16-token budget (every sequence its own micro batch); reset by checkpoint."""
    group = WorkerGroup(
        "policy", make_config(tiny_model_path, micro_batch_max_tokens=16), total_optimizer_steps=10
    )
    init_dir = tmp_path_factory.mktemp("init_ckpt")
    group.run("save_checkpoint", str(init_dir))
    yield group, str(init_dir)
    group.shutdown()


@pytest.mark.parametrize(
    "reduction", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean"]
)
def test_dp2_many_micro_batches_match_single_process_step(
    dp2_small_micro, batch, tiny_model_path, reduction
):
    group, init_dir = dp2_small_micro
    group.run("load_checkpoint", init_dir)
    stats = train_one_step(group, batch, reduction, dp_size=2, train_batch_size=2)
    assert stats.packing.local_micro_batches >= 4  # 4 sequences, 16-token budget
    per_rank = group.run("state_dict_for_sync", True)
    for name in per_rank[0]:
        assert torch.equal(per_rank[0][name], per_rank[1][name]), f"ranks disagree on {name}"
    assert_weights_close(
        per_rank[0], reference_weights(tiny_model_path, batch, reduction), atol=1e-6
    )


def test_zero_loss_padding_rows_do_not_change_the_update(dp2_small_micro, tiny_model_path):
    # 3 sequences of one prompt on 2 ranks: one zero-loss padding row is added.
    group, init_dir = dp2_small_micro
    group.run("load_checkpoint", init_dir)
    odd = make_batch(tiny_model_path, ["a", "a", "a"], LENGTHS[:3])
    uids = odd.metadata["uids"]
    bounds = compute_prompt_mini_batch_boundaries(uids, 1, 1)
    staged = MeshDispatch.stage_chunks(
        2,
        odd,
        bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )
    assert staged.pad_sizes == [1]
    group.train_mini_batch(staged[0])
    assert_weights_close(
        group.run("state_dict_for_sync")[0],
        reference_weights(tiny_model_path, odd, "token_mean"),
        atol=1e-6,
    )


def test_forward_logprobs_equal_plain_transformers(dp2_small_micro, batch, tiny_model_path):
    group, init_dir = dp2_small_micro
    group.run("load_checkpoint", init_dir)
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], 2, 2)
    logprobs = group.forward(MeshDispatch.stage_chunks(2, batch, bounds), len(batch))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        expected = row_logprobs(model, batch)
    # reported at the loss tokens only (the LM head runs at their predictors), 0 elsewhere
    torch.testing.assert_close(logprobs, expected * batch.loss_mask, atol=1e-5, rtol=0)


def test_checkpoint_resume_gives_the_uninterrupted_next_step(dp2_small_micro, batch, tmp_path):
    group, init_dir = dp2_small_micro
    group.run("load_checkpoint", init_dir)
    train_one_step(group, batch, "token_mean", 2, 2)
    group.run("save_checkpoint", str(tmp_path))
    train_one_step(group, batch, "token_mean", 2, 2)
    uninterrupted = group.run("state_dict_for_sync")[0]
    group.run("load_checkpoint", init_dir)  # scramble, then resume
    group.run("load_checkpoint", str(tmp_path))
    train_one_step(group, batch, "token_mean", 2, 2)
    assert_weights_close(group.run("state_dict_for_sync")[0], uninterrupted, atol=0.0)


def test_one_optimizer_step_per_mini_batch_for_step_wise_data(dp2_small_micro, tiny_model_path):
    # 4 prompts x 2 samples with 1..5 turns each (one row per turn): 2 mini-batches of 2 prompts
    # x 2 update epochs = 4 optimizer steps, whatever the turn counts.
    group, init_dir = dp2_small_micro
    group.run("load_checkpoint", init_dir)
    turns = [[1, 3], [5, 2], [4, 1], [2, 2]]
    uids = [f"p{p}" for p, per_sample in enumerate(turns) for t in per_sample for _ in range(t)]
    lengths = [LENGTHS[i % 4] for i in range(len(uids))]
    data = make_batch(tiny_model_path, uids, lengths)
    bounds = compute_prompt_mini_batch_boundaries(uids, 2, 4, step_wise=True)
    assert len(bounds) == 2
    before = group.run("global_steps")[0]
    for _epoch in range(2):
        staged = MeshDispatch.stage_chunks(
            2,
            data,
            bounds,
            loss_weights_fn=lambda mb: compute_loss_weights(
                "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
            ),
        )
        for chunks in staged:
            group.train_mini_batch(chunks)
    assert group.run("global_steps") == [before + 4, before + 4]


@pytest.mark.parametrize(("dp_size", "zero_stage"), [(1, 0), (2, 2), (2, 3)])
def test_dp_size_and_zero_stage_give_the_same_update(
    ray_cluster, tiny_model_path, batch, dp_size, zero_stage
):
    cfg = make_config(tiny_model_path, dp_size=dp_size, zero_stage=zero_stage)
    group = WorkerGroup("policy", cfg, total_optimizer_steps=10)
    try:
        stats = train_one_step(group, batch, "token_mean", dp_size=dp_size, train_batch_size=2)
        if dp_size == 1:  # prompts "a" and "b" (4 tokens each) packed once for their 2 rows
            assert stats.packing.shared_prefix_tokens == 8
        synced = group.run("state_dict_for_sync")
        assert all(w is None for w in synced[1:])
        assert_weights_close(
            synced[0],
            reference_weights(tiny_model_path, batch, "token_mean"),
            atol=1e-6 if zero_stage == 0 else 1e-5,
        )
        # the broadcast weight sync (gloo) delivers exactly these weights, gathered under
        # ZeRO-3 too, into an engine that started from other weights
        engine = HFEngine(build_tiny_model(seed=1))
        BroadcastWeightSync(group, engine, cfg).sync()
        assert_weights_close(dict(engine.model.named_parameters()), synced[0], atol=0.0)
    finally:
        group.shutdown()


def test_non_finite_loss_refuses_the_step_on_every_rank(dp2_small_micro, batch, tiny_model_path):
    group, init_dir = dp2_small_micro
    group.run("load_checkpoint", init_dir)
    before = group.run("state_dict_for_sync")[0]
    steps_before = group.run("global_steps")
    poisoned = batch.replace(advantages=batch.advantages.clone())
    poisoned.advantages[3, PROMPT_LEN] = float("nan")  # one token of one row: one rank's loss
    stats = train_one_step(group, poisoned, "token_mean", 2, 2)
    assert stats.nonfinite and math.isnan(stats.grad_norm)
    assert group.run("global_steps") == steps_before  # no optimizer step anywhere
    assert_weights_close(group.run("state_dict_for_sync")[0], before, atol=0.0)
    # the refused gradients are gone: the next finite step is exactly a fresh first step
    stats = train_one_step(group, batch, "token_mean", 2, 2)
    assert not stats.nonfinite
    expected = reference_weights(tiny_model_path, batch, "token_mean")
    assert_weights_close(group.run("state_dict_for_sync")[0], expected, atol=2e-6)


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_a_refused_step_leaves_no_gradient_behind_under_zero(
    ray_cluster, tiny_model_path, batch, zero_stage
):
    """ZeRO 1/2 accumulate the micro batches' gradients in the optimizer's own partitions;
    ZeRO-2 kept a refused step's there, so the next step added them to its own (its grad norm
    doubled; with NaN gradients the next step was refused too). At ZeRO 3 dropping them
    raised AttributeError (ZeRO 1/2's clean-up)."""
    cfg = make_config(tiny_model_path, zero_stage=zero_stage, micro_batch_max_tokens=16)
    group = WorkerGroup("policy", cfg, total_optimizer_steps=10)
    try:
        poisoned = batch.replace(advantages=batch.advantages.clone())
        poisoned.advantages[3, PROMPT_LEN] = float("nan")
        assert train_one_step(group, poisoned, "token_mean", 2, 2).nonfinite
        stats = train_one_step(group, batch, "token_mean", 2, 2)
        assert not stats.nonfinite
        assert_weights_close(
            group.run("state_dict_for_sync")[0],
            reference_weights(tiny_model_path, batch, "token_mean"),
            atol=1e-5,
        )
    finally:
        group.shutdown()


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_an_inf_gradient_under_a_finite_loss_refuses_the_step(
    ray_cluster, tiny_model_path, batch, zero_stage
):
    """One gradient entry on rank 0 is inf (a hook on one weight's gradient), every loss is
    finite. At ZeRO 0/1 the worker finds it in the local gradients; at 2/3 they live in the
    optimizer's partitions and DeepSpeed's own check of the step's grad norm skips the step
    (the worker reported DeepSpeed's inf grad norm and counted the skipped step in
    ``global_steps``). Either way: no weight, schedule or step count moves, the grad norm is
    NaN, and the next step is a fresh first step."""

    def poison(worker):  # nested: Ray pickles it by value into the actor
        name = "model.layers.0.self_attn.q_proj.weight"
        param = dict(worker.engine.module.named_parameters())[name]

        def to_inf(grad):
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
            return grad

        worker.poison_hook = param.register_hook(to_inf)

    def cure(worker):
        worker.poison_hook.remove()

    def counters(worker):  # optimizer steps, and the LR schedule's steps
        return worker.global_steps(), worker.engine.lr_scheduler.last_epoch

    cfg = make_config(tiny_model_path, zero_stage=zero_stage, micro_batch_max_tokens=16)
    group = WorkerGroup("policy", cfg, total_optimizer_steps=10)
    try:
        before = group.run("state_dict_for_sync")[0]
        group.get([group.actors[0].__ray_call__.remote(poison)])
        stats = train_one_step(group, batch, "token_mean", 2, 2)
        group.get([group.actors[0].__ray_call__.remote(cure)])
        assert math.isfinite(stats.losses.loss)
        assert stats.nonfinite and math.isnan(stats.grad_norm)
        assert group.get([a.__ray_call__.remote(counters) for a in group.actors]) == [(0, 0)] * 2
        assert_weights_close(group.run("state_dict_for_sync")[0], before, atol=0.0)
        # nothing of the refused step is left: the next step is exactly a fresh first step
        # (AdamW at step 2 from zero moments: lr 0.526 g / (0.707 |g| + eps), not lr g / (|g| + eps))
        stats = train_one_step(group, batch, "token_mean", 2, 2)
        assert not stats.nonfinite and math.isfinite(stats.grad_norm)
        assert group.get([a.__ray_call__.remote(counters) for a in group.actors]) == [(1, 1)] * 2
        assert_weights_close(
            group.run("state_dict_for_sync")[0],
            reference_weights(tiny_model_path, batch, "token_mean"),
            atol=1e-5,
        )
    finally:
        group.shutdown()


def test_streamed_weight_buckets_are_the_full_state_dict(dp2_small_micro):
    group, _ = dp2_small_micro
    buckets = list(group.stream_weight_buckets(64 << 10))  # 64 KiB: many buckets
    merged = {name: t for bucket in buckets for name, t in bucket.items()}
    assert len(buckets) > 1 and sum(len(b) for b in buckets) == len(merged)
    assert_weights_close(merged, group.run("state_dict_for_sync")[0], atol=0.0)


def test_shared_weights_written_by_rank_0_are_the_full_state_dict(dp2_small_micro):
    from skyrl.inference.shared_weights import create_shared_weights

    group, _ = dp2_small_micro
    [plan] = group.get([group.actors[0].weight_sync_plan.remote(64 << 10)])
    handle = create_shared_weights(plan)
    try:
        group.run("write_shared_weights", handle)  # rank 0 writes, both ranks gather
        assert_weights_close(dict(handle), group.run("state_dict_for_sync")[0], atol=0.0)
    finally:
        handle.release()


def test_policy_loss_is_a_mean_whatever_the_mini_batch_size(ray_cluster, tiny_model_path, batch):
    """The same 2 prompts as 1 mini-batch of 2 or 2 mini-batches of 1 report the same
    ``policy/loss``: a mean over mini-batches (the old reduction summed, doubling it at 1)."""
    # lr 1e-9 with Adam eps 1.0: the first steps move each weight by < 1e-9, so every
    # mini-batch sees ratio pi / pi_old = 1 up to the packed-vs-padded forward (float32
    # rounding, ~1e-7 per logprob) and PPO's L_t = -A_t r_t = -A_t. Measured off by 7e-8.
    cfg = make_config(tiny_model_path, **{"policy_optimizer.lr": 1e-9})
    group = WorkerGroup("policy", cfg, total_optimizer_steps=10)
    try:
        reported = {
            size: step_metrics(
                POLICY,
                [group.train_mini_batch(c) for c in stage_mini_batches(batch, "prompt_mean", size)],
            )
            for size in (2, 1)
        }
    finally:
        group.shutdown()
    # prompt_mean: each prompt's token mean of -A, then the mean over the mini-batch's prompts.
    # Prompt a = rows 0-1 (12 + 5 loss tokens), b = rows 2-3 (9 + 2), A constant per row:
    #   size 2: one mini-batch, (loss_a + loss_b) / 2;  size 1: mean of loss_a and loss_b.
    adv, mask = batch.advantages, batch.loss_mask
    per_prompt = [float(-(adv[r] * mask[r]).sum() / mask[r].sum()) for r in ([0, 1], [2, 3])]
    expected = sum(per_prompt) / 2
    assert abs(expected) > 0.1  # far from 0: a sum (2x) could not pass the tolerance below
    assert reported[2][POLICY.loss] == pytest.approx(expected, abs=1e-6)
    assert reported[1][POLICY.loss] == pytest.approx(expected, abs=1e-6)
    assert reported[1][POLICY.optimizer_steps] == 2 and reported[2][POLICY.optimizer_steps] == 1
    assert reported[1][POLICY.loss_tokens] == reported[2][POLICY.loss_tokens] == 28  # 17 + 11
    # approx_kl at ratio 1 is 0 in both layouts; every grad norm was measured
    assert reported[1][POLICY.token_mean("approx_kl")] == pytest.approx(0.0, abs=1e-6)
    assert reported[1][POLICY.grad_norm_max] >= reported[1][POLICY.grad_norm] > 0


REFUSAL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from worker_helpers import MAX_SEQ_LEN, PROMPT_LEN, make_batch, make_config

    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch import compute_prompt_mini_batch_boundaries
    from skyrl.dispatch import MeshDispatch
    from skyrl.workers.distributed import find_free_port
    from skyrl.workers.worker import TrainingWorker

    model_path, cases = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)
    batch = make_batch(model_path, ["a", "a", "b", "b"], [16, 9, 13, 6])
    nan_loss = batch.replace(advantages=batch.advantages.clone())
    nan_loss.advantages[3, PROMPT_LEN] = float("nan")

    def chunk(data):
        bounds = compute_prompt_mini_batch_boundaries(data.metadata["uids"], 2, 2)
        ((c,),) = MeshDispatch.stage_chunks(
            1, data, bounds,
            loss_weights_fn=lambda mb: compute_loss_weights(
                "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
            ),
        )
        return c

    def inf_in_first_micro_batch(worker):  # one entry of one weight's gradient, once
        param = dict(worker.engine.module.named_parameters())[
            "model.layers.0.self_attn.q_proj.weight"
        ]
        calls = []

        def to_inf(grad):
            calls.append(1)
            if len(calls) > 1:
                return grad
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
            return grad

        return param.register_hook(to_inf)

    out = []
    for zero_stage, precision, offload in cases:
        cfg = make_config(
            model_path, dp_size=1, zero_stage=zero_stage, precision=precision,
            offload_optimizer=offload, micro_batch_max_tokens=16,  # 3 micro batches
        )

        def worker():
            return TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), cfg, 10)

        fresh = worker()
        fresh.train_mini_batch(chunk(batch))
        first_step = fresh.state_dict_for_sync(all_ranks=True)
        record = {"case": [zero_stage, precision, offload]}
        for refusal in ("nan_loss", "inf_gradient"):
            w = worker()
            if refusal == "nan_loss":
                refused = w.train_mini_batch(chunk(nan_loss))
            else:
                hook = inf_in_first_micro_batch(w)
                refused = w.train_mini_batch(chunk(batch))
                hook.remove()
            steps = [w.global_steps(), w.engine.lr_scheduler.last_epoch]
            after = w.train_mini_batch(chunk(batch))
            record[refusal] = {
                "refused": refused.nonfinite,
                "steps": steps,
                "next_grad_norm": after.grad_norm,
                "next_vs_first_step": max(
                    float((v.float() - first_step[k].float()).abs().max())
                    for k, v in w.state_dict_for_sync(all_ranks=True).items()
                ),
            }
        out.append(record)
    print(json.dumps(out))
    """
)


def test_after_a_refused_step_the_next_is_a_fresh_first_step_in_every_layout(tiny_model_path):
    """A refused step (a NaN loss, or an inf gradient in the first of three micro batches
    under finite losses) leaves nothing behind in the layouts the Ray tests above do not
    cover: ZeRO 3 (dropping the gradients of a NaN loss raised AttributeError), the
    optimizer offloaded to the CPU (ZeRO 2 added the dropped CPU gradients to the next step's;
    after DeepSpeed's own skipped step at ZeRO 1 with fp32 accumulation the next step was NaN
    too), and bf16 at ZeRO 1 (DeepSpeed's BF16_Optimizer). One rank, in-process."""
    cases = [[3, "fp32", False], [1, "bf16", False], [1, "bf16", True], [2, "bf16", True]]
    result = subprocess.run(
        [sys.executable, "-c", REFUSAL_SCRIPT, tiny_model_path, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parent,  # worker_helpers
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for record in json.loads(result.stdout.strip().splitlines()[-1]):
        for refusal in ("nan_loss", "inf_gradient"):
            got = record[refusal]
            where = f"{record['case']} {refusal}: {got}"
            assert got["refused"] and got["steps"] == [0, 0], where
            # the next step starts from the same weights with the same gradients: bit-equal
            assert math.isfinite(got["next_grad_norm"]), where
            assert got["next_vs_first_step"] == 0.0, where
