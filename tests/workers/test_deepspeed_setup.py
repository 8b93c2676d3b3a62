"""``build_engine`` on one data-parallel rank: no gradient all-reduce, AdamW's state made up
front, one grad norm per step, and the same update as plain torch.

Each case runs in a fresh interpreter: DeepSpeed initializes ``torch.distributed`` (gloo,
world size 1) for the whole process, which must not leak into the other tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from transformers import AutoModelForCausalLM

    from skyrl.config.trainer import OptimizerConfig, TrainerConfig
    from skyrl.workers import deepspeed_setup
    from skyrl.workers.deepspeed_setup import build_engine, final_grad_norm
    from skyrl.workers.distributed import find_free_port, set_dist_env

    model_path, zero_stage = sys.argv[1], int(sys.argv[2])
    set_dist_env(0, 1, "127.0.0.1", find_free_port(), 1)
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
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, model_path, str(zero_stage)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


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
    from skyrl.workers.distributed import find_free_port, set_dist_env

    model_path = sys.argv[1]
    set_dist_env(0, 1, "127.0.0.1", find_free_port(), 1)
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
    result = subprocess.run(
        [sys.executable, "-c", BF16_SCRIPT, tiny_model_path],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
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
    from skyrl.workers.distributed import find_free_port, set_dist_env

    model_path, zero_stage = sys.argv[1], int(sys.argv[2])
    set_dist_env(0, 1, "127.0.0.1", find_free_port(), 1)
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
    result = subprocess.run(
        [sys.executable, "-c", INFERENCE_SCRIPT, tiny_model_path, str(zero_stage)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["diff"] == 0.0
