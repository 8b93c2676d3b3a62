"""``build_engine`` on one data-parallel rank: no gradient all-reduce, AdamW's state made up
front, one grad norm per step, and the same update as plain torch.

Each case runs in a fresh interpreter: DeepSpeed initializes ``torch.distributed`` (gloo,
world size 1) for the whole process, which must not leak into the other tests.
"""

from __future__ import annotations

import textwrap

import pytest
from worker_helpers import run_script

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from transformers import AutoModelForCausalLM

    from skyrl.config.trainer import OptimizerConfig, TrainerConfig
    from skyrl.workers import deepspeed_setup
    from skyrl.workers.deepspeed_setup import build_engine, final_grad_norm
    from skyrl.workers.distributed import find_free_port, init_distributed, set_dist_env

    model_path, zero_stage = sys.argv[1], int(sys.argv[2])
    set_dist_env(0, 1, "127.0.0.1", find_free_port(), 1)
    init_distributed(1)  # as the worker does: gloo, without compiling DeepSpeed's shm op
    def load():
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    torch.manual_seed(0)
    ids = torch.randint(0, load().config.vocab_size, (1, 24))

    opt_cfg = OptimizerConfig(lr=1e-2, eps=1.0, weight_decay=0.1, max_grad_norm=0.5)
    engine = build_engine(load(), TrainerConfig(zero_stage=zero_stage), opt_cfg, 10)
    initial = load()
    moved_at_build = max(
        float((p - initial.get_parameter(n)).abs().max()) for n, p in engine.module.named_parameters()
    )
    torch_opt = engine.optimizer
    while not isinstance(torch_opt, torch.optim.Optimizer):
        torch_opt = torch_opt.optimizer
    state_at_build = [
        [float(s["step"]), float(s["exp_avg"].abs().max()), float(s["exp_avg_sq"].abs().max())]
        for s in torch_opt.state.values()
    ]
    calls, norms = [], []
    reduce = engine.buffered_allreduce_fallback
    engine.buffered_allreduce_fallback = lambda *a, **k: (calls.append(1), reduce(*a, **k))[1]
    total_norm = deepspeed_setup.torch.nn.utils.get_total_norm
    def counted(*a, **k):
        norms.append(1)
        return total_norm(*a, **k)
    deepspeed_setup.torch.nn.utils.get_total_norm = counted
    clip_calls = []
    clip = deepspeed_setup.torch.nn.utils.clip_grads_with_norm_
    def counted_clip(*a, **k):
        clip_calls.append(1)
        return clip(*a, **k)
    deepspeed_setup.torch.nn.utils.clip_grads_with_norm_ = counted_clip
    engine_norms, norm_calls, scale_after_step = [], [], []
    for _ in range(2):  # two optimizer steps of two micro batches each, as the worker takes them
        norms.clear()
        for part in (ids[:, :12], ids[:, 12:]):
            engine.backward(engine(input_ids=part, labels=part).loss, scale_wrt_gas=False)
        final_grad_norm(engine)  # the worker's non-finite check
        engine.step()
        engine_norms.append(float(engine.get_global_grad_norm() or float("nan")))
        norm_calls.append(len(norms))
        scale_after_step.append(getattr(torch_opt, "grad_scale", None))
    deepspeed_setup.torch.nn.utils.get_total_norm = total_norm
    deepspeed_setup.torch.nn.utils.clip_grads_with_norm_ = clip

    # the same steps in plain torch: AdamW, global-norm clipping at 0.5
    plain = load()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, eps=1.0, weight_decay=0.1)
    plain_norms = []
    for _ in range(2):
        for part in (ids[:, :12], ids[:, 12:]):
            plain(input_ids=part, labels=part).loss.backward()
        plain_norms.append(float(torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)))
        opt.step()
        opt.zero_grad()
    trained = dict(engine.module.named_parameters())
    diff = max(float((trained[k] - v).abs().max()) for k, v in plain.named_parameters())
    print(json.dumps({
        "allreduce_calls": len(calls),
        "enabled": engine.enable_backward_allreduce,
        "grad_norms": engine_norms,
        "plain_norms": plain_norms,
        "norm_calls": norm_calls,
        "clip_calls": len(clip_calls),
        "scale_after_step": scale_after_step,
        "moved_at_build": moved_at_build,
        "state_at_build": state_at_build,
        "params": sum(1 for _ in engine.module.parameters()),
        "max_weight_diff": diff,
    }))
    """
)


def run_case(model_path: str, zero_stage: int) -> dict:
    return run_script(SCRIPT, model_path, str(zero_stage))


def test_one_rank_zero0_skips_the_allreduce_and_matches_torch(tiny_model_path):
    out = run_case(tiny_model_path, zero_stage=0)
    assert out["allreduce_calls"] == 0 and out["enabled"] is False
    # AdamW's state exists before the first step, as that step would have made it: step
    # count 0 and zero moments for every parameter, and no weight moved
    assert out["state_at_build"] == [[0.0, 0.0, 0.0]] * out["params"]
    assert out["moved_at_build"] == 0.0
    # the non-finite check's norm is the step's: one norm per step, clipping included
    assert out["norm_calls"] == [1, 1]
    # the updates are plain torch's: AdamW (weight decay 0.1, so a wrong step count or a
    # decayed weight at build would show) after clipping the summed gradients to norm 0.5
    assert out["grad_norms"] == pytest.approx(out["plain_norms"], rel=1e-5)
    assert min(out["plain_norms"]) > 0.5  # so the clipping did act
    assert out["max_weight_diff"] < 1e-6
    # clipping scaled the gradients inside the fused AdamW step (its grad_scale), not in a
    # pass of its own, and the scale applied to that step only
    assert out["clip_calls"] == 0
    assert out["scale_after_step"] == [None, None]


def test_zero1_keeps_the_reduction(tiny_model_path):
    """At ZeRO 1 the reduction also hands the gradients to the optimizer: it stays on."""
    out = run_case(tiny_model_path, zero_stage=1)
    assert out["enabled"] is True
    assert out["state_at_build"] == []  # ZeRO's own optimizer makes its state in its step
    assert out["norm_calls"] == [0, 0]  # nothing taken here: DeepSpeed clips at ZeRO >= 1
    assert out["max_weight_diff"] < 1e-6


BF16_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM

    from skyrl.config.trainer import OptimizerConfig, TrainerConfig
    from skyrl.workers.deepspeed_setup import build_engine
    from skyrl.workers.distributed import find_free_port, init_distributed, set_dist_env

    model_path = sys.argv[1]
    set_dist_env(0, 1, "127.0.0.1", find_free_port(), 1)
    init_distributed(1)  # as the worker does: gloo, without compiling DeepSpeed's shm op
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    initial = [p.detach().float().clone() for p in model.parameters()]

    LR, WD, EPS = 1e-2, 0.1, 1e-8
    opt_cfg = OptimizerConfig(lr=LR, eps=EPS, weight_decay=WD, max_grad_norm=0.0)
    engine = build_engine(model, TrainerConfig(zero_stage=0, precision="bf16"), opt_cfg, 10)
    wrapper = engine.optimizer
    inner = wrapper.optimizer
    masters = [m for group in wrapper.fp32_groups for m in group]
    lows = [p for group in wrapper.fp16_groups for p in group]
    assert len(masters) == len(initial)
    state_at_build = sorted({
        (float(s["step"]), float(s["exp_avg"].abs().max()), float(s["exp_avg_sq"].abs().max()))
        for s in inner.state.values()
    })
    master_vs_initial = max(float((m - w).abs().max()) for m, w in zip(masters, initial))
    model_vs_initial = max(float((p.float() - w).abs().max()) for p, w in zip(lows, initial))

    grads = []
    inner.register_step_pre_hook(
        lambda *_: grads.extend(m.grad.detach().clone() for m in masters)
    )
    engine.backward(engine(input_ids=ids, labels=ids).loss, scale_wrt_gas=False)
    engine.step()
    # AdamW's step 1 from zero moments: m = 0.1 g, v = 0.001 g^2; bias corrections 0.1 and
    # 0.001 give m_hat = g, sqrt(v_hat) = |g|: w1 = w0 (1 - lr wd) - lr g / (|g| + eps)
    expected = [w * (1 - LR * WD) - LR * g / (g.abs() + EPS) for w, g in zip(initial, grads)]
    step_error = max(float((m - e).abs().max()) for m, e in zip(masters, expected))
    moved = max(float((m - w).abs().max()) for m, w in zip(masters, initial))
    model_vs_master = max(float((p.float() - m.bfloat16().float()).abs().max()) for p, m in zip(lows, masters))
    print(json.dumps({
        "wrapper": type(wrapper).__name__,
        "state_at_build": state_at_build,
        "master_vs_initial": master_vs_initial,
        "model_vs_initial": model_vs_initial,
        "steps_after": sorted({float(s["step"]) for s in inner.state.values()}),
        "step_error": step_error,
        "moved": moved,
        "model_vs_master": model_vs_master,
    }))
    """
)


def test_bf16_zero0_first_step_is_adamw_step_one_from_the_models_weights(tiny_model_path):
    """bf16 at ZeRO 0 (the GPU default) wraps AdamW in DeepSpeed's FP16_UnfusedOptimizer,
    which steps AdamW once over zero gradients when it is built. That step must leave no
    trace: step count 0, zero moments, fp32 master weights equal to the model's (not decayed
    by 1 - lr * wd = 0.999), so the first real update is AdamW's step 1 (lr * sign(g) with
    eps 1e-8, not step 2's 0.744 lr)."""
    out = run_script(BF16_SCRIPT, tiny_model_path)
    assert out["wrapper"] == "FP16_UnfusedOptimizer"
    assert out["state_at_build"] == [[0.0, 0.0, 0.0]]
    assert out["master_vs_initial"] == 0.0  # bf16 -> fp32 is exact
    assert out["model_vs_initial"] == 0.0
    assert out["steps_after"] == [1.0]
    # fp32 rounding of w (1 - lr wd) and of the update: a few ulp of weights below ~2
    assert out["step_error"] < 5e-7
    assert out["moved"] > 5e-3  # the step did move weights (lr = 1e-2)
    assert out["model_vs_master"] == 0.0  # the model holds the masters rounded to bf16


INFERENCE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM

    from skyrl.config.trainer import TrainerConfig
    from skyrl.workers.deepspeed_setup import build_engine
    from skyrl.workers.distributed import find_free_port, init_distributed, set_dist_env

    model_path, zero_stage = sys.argv[1], int(sys.argv[2])
    set_dist_env(0, 1, "127.0.0.1", find_free_port(), 1)
    init_distributed(1)  # as the worker does: gloo, without compiling DeepSpeed's shm op
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = torch.randint(0, plain.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    engine = build_engine(model, TrainerConfig(zero_stage=zero_stage), None, 10)
    with torch.no_grad():
        diff = float((engine(input_ids=ids).logits - plain(input_ids=ids).logits).abs().max())
    print(json.dumps({"diff": diff}))
    """
)


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_an_inference_engine_builds_at_every_zero_stage(tiny_model_path, zero_stage):
    """The reference role has no optimizer; DeepSpeed refuses ZeRO 1/2 without one ("zero
    stage 2 requires an optimizer"), so PPO or a KL loss could not start at those stages.
    They only shard optimizer and gradient state, which an inference engine has none of:
    it runs at stage 0 and computes what the plain model does."""
    assert run_script(INFERENCE_SCRIPT, tiny_model_path, str(zero_stage))["diff"] == 0.0


OFFLOAD_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM
    from worker_helpers import MAX_SEQ_LEN, make_batch, make_config

    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch import compute_prompt_mini_batch_boundaries
    from skyrl.dispatch import MeshDispatch
    from skyrl.workers.distributed import find_free_port
    from skyrl.workers.worker import TrainingWorker

    model_path, zero_stage = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    batch = make_batch(model_path, ["a", "a", "b", "b"], [16, 9, 13, 6])
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], 2, 2)
    ((chunk,),) = MeshDispatch.stage_chunks(
        1, batch, bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )
    initial = dict(AutoModelForCausalLM.from_pretrained(model_path).named_parameters())
    runs = []
    for offload in (False, True):
        cfg = make_config(
            model_path, dp_size=1, zero_stage=zero_stage, offload_optimizer=offload,
            micro_batch_max_tokens=16, **{"policy_optimizer.max_grad_norm": 0.5},
        )
        worker = TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), cfg, 10)
        records = [worker.train_mini_batch(chunk) for _ in range(2)]  # two AdamW steps
        runs.append({
            "optimizer": type(worker.engine.optimizer).__name__,
            "cpu_offload": bool(getattr(worker.engine.optimizer, "cpu_offload", False)
                                or getattr(worker.engine.optimizer, "offload_optimizer", False)),
            "grad_norms": [r.grad_norm for r in records],
            "losses": [r.losses.loss for r in records],
            "steps": worker.global_steps(),
            "weights": worker.state_dict_for_sync(all_ranks=True),
        })
    plain, offloaded = runs
    print(json.dumps({
        "optimizers": [r["optimizer"] for r in runs],
        "cpu_offload": [r["cpu_offload"] for r in runs],
        "grad_norms": [r["grad_norms"] for r in runs],
        "losses": [r["losses"] for r in runs],
        "steps": [r["steps"] for r in runs],
        "moved": max(float((w - initial[k]).abs().max()) for k, w in plain["weights"].items()),
        "max_weight_diff": max(
            float((offloaded["weights"][k] - w).abs().max()) for k, w in plain["weights"].items()
        ),
    }))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_offloaded_optimizer_takes_the_step_of_one_on_the_device(tiny_model_path, zero_stage):
    """``trainer.offload_optimizer`` keeps the AdamW state in CPU memory (ZeRO-Offload). It
    changes where the optimizer runs, not what it computes: two steps of a policy worker with
    the state offloaded equal two steps without, to the bit. DeepSpeed refused any client
    optimizer but its own DeepSpeedCPUAdam for offload unless told otherwise."""
    out = run_script(OFFLOAD_SCRIPT, tiny_model_path, str(zero_stage))
    assert out["cpu_offload"] == [False, True]
    assert out["steps"] == [2, 2]
    assert out["moved"] > 1e-3  # the steps moved weights (lr 0.05)
    # the same arithmetic on the same fp32 gradients, so equal, not close; only ZeRO 3's
    # offloaded grad norm comes back rounded to fp32 (8.8685007 vs 8.8685003 at step 1: half
    # an fp32 ulp, which at 8.87 is 2^3 * 2^-23 = 9.5e-7, 1.1e-7 relative)
    assert out["grad_norms"][1] == pytest.approx(out["grad_norms"][0], rel=1e-7, abs=0)
    assert out["losses"][1] == out["losses"][0]
    assert out["max_weight_diff"] == 0.0


ACCUMULATION_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from worker_helpers import MAX_SEQ_LEN, make_batch, make_config

    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch import compute_prompt_mini_batch_boundaries
    from skyrl.dispatch import MeshDispatch
    from skyrl.workers.distributed import find_free_port
    from skyrl.workers.worker import TrainingWorker

    model_path, zero_stage = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    num_prompts = 16
    uids = [f"p{i // 2}" for i in range(2 * num_prompts)]
    batch = make_batch(model_path, uids, [16 - i % 7 for i in range(2 * num_prompts)])
    bounds = compute_prompt_mini_batch_boundaries(uids, num_prompts, num_prompts)
    ((chunk,),) = MeshDispatch.stage_chunks(
        1, batch, bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )
    cfg = make_config(
        model_path, dp_size=1, zero_stage=zero_stage, precision="bf16",
        micro_batch_max_tokens=16, train_batch_size=num_prompts,
        policy_mini_batch_size=num_prompts,
    )
    worker = TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), cfg, 10)
    # lr 0: every step below leaves the weights alone, so each sees the same model
    adamw = worker.engine.basic_optimizer
    for group in adamw.param_groups:
        group["lr"] = 0.0
    worker.engine.lr_scheduler.base_lrs = [0.0] * len(adamw.param_groups)
    seen = []  # the fp32 gradient AdamW steps with
    adamw.register_step_pre_hook(lambda *_: seen.append(
        [p.grad.float().clone() for g in adamw.param_groups for p in g["params"]]
    ))
    worker.engine.train()
    micro = worker._micro_batches(chunk)
    fp32_sum = None  # each micro batch's gradient alone (one step each), added in fp32
    for mb in micro:
        loss, _, _ = worker._micro_batch_loss(chunk, mb)
        worker.engine.backward(loss, scale_wrt_gas=False)
        worker.engine.step()
        grads = seen.pop()
        fp32_sum = grads if fp32_sum is None else [s + g for s, g in zip(fp32_sum, grads)]
    worker.train_mini_batch(chunk)  # all of them accumulated, one step
    (accumulated,) = seen

    def norm(tensors):
        return sum(float(t.double().pow(2).sum()) for t in tensors) ** 0.5

    print(json.dumps({
        "optimizer": type(worker.engine.optimizer).__name__,
        "micro_batches": len(micro),
        "error": norm([a - s for a, s in zip(accumulated, fp32_sum)]) / norm(fp32_sum),
        "one_rounding": norm([s.bfloat16().float() - s for s in fp32_sum]) / norm(fp32_sum),
    }))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [1, 2])
def test_bf16_micro_batch_gradients_add_up_in_fp32(tiny_model_path, zero_stage):
    """In bf16 the gradients of a mini-batch's micro batches add up in fp32 at ZeRO >= 1
    (``data_types.grad_accum_dtype``). Added in bf16, 32 micro batches put the step's gradient
    0.57% (relative L2) off the fp32 sum of the very same micro-batch gradients, 3.5x the
    0.16% of rounding that sum to bf16 once."""
    out = run_script(ACCUMULATION_SCRIPT, tiny_model_path, str(zero_stage))
    print(out)
    assert out["micro_batches"] == 32
    if zero_stage == 1:
        # DeepSpeed's BF16_Optimizer adds up in fp32, then all-reduces the sum in bf16 (even
        # on one rank): exactly one rounding of it
        assert out["optimizer"] == "BF16_Optimizer"
        assert out["error"] == pytest.approx(out["one_rounding"], rel=1e-6)
    else:
        # the fp32 partitions add up the same fp32 numbers in the same order: a few fp32 ulp
        # (2^-24 = 6e-8 relative) at most
        assert out["error"] < 1e-6
    assert out["one_rounding"] < 0.0025  # bf16's 8-bit mantissa: about 2^-9 / sqrt(3) = 0.11%
