"""Building a DeepSpeed engine for one role: config dict, model, AdamW, LR schedule.

Departures from DeepSpeed defaults, on purpose:
- ``managed_gradient_accumulation`` is off: a mini-batch is packed into a
  varying number of micro batches, the caller scales each micro-batch loss
  itself and calls ``engine.step()`` exactly once per mini-batch.
- The optimizer is torch's AdamW (a client optimizer): FusedAdam and
  DeepSpeedCPUAdam each compile for minutes on CPU. torch's own fused kernel
  (``fused=True``, CPU and CUDA) needs no compiling: on SmolLM2's 135M parameters it steps
  in 0.26 s on 2 CPU threads vs 0.64 s for the default (for-loop) implementation. With
  ``trainer.offload_optimizer`` it steps the CPU partitions (``zero_force_ds_cpu_optimizer``
  off: DeepSpeed refuses a client optimizer for offload otherwise); the update is the one
  without offload.
- In bf16 at ZeRO 1-3 the micro batches' gradients add up in fp32
  (``data_types.grad_accum_dtype``; at ZeRO 1 DeepSpeed then wraps AdamW in its
  ``BF16_Optimizer``). Added in bf16, 32 micro batches of the tiny test model gave the step a
  gradient 0.57% (relative L2) off their fp32 sum; in fp32 it is exact at ZeRO 2/3 and one
  bf16 rounding (0.16%) at ZeRO 1, where DeepSpeed all-reduces it in bf16. DeepSpeed has no
  fp32 accumulation for bf16 at ZeRO 0 (it raises ``NotImplementedError``): there the
  gradients still add up in bf16.
- Warm-up and the cosine schedule count OPTIMIZER steps.
- With one data-parallel rank at ZeRO 0 in fp32 there is nothing to all-reduce, yet
  DeepSpeed still flattens every gradient into a bucket and copies it back at each step
  (15% of the train phase of SmolLM2 at dp 1, py-spy): ``_skip_lone_allreduce`` turns
  that off. The gradients then stay where backward left them, in ``.grad``; their norm is
  taken once per step, by the worker's non-finite check, and reused by clipping
  (``final_grad_norm``).
- AdamW's moments are allocated when the engine is built (``_allocate_adam_state``), not in
  the first step: allocated there, after the first step's activations were freed, they took
  the activations' memory and the second step grew the process by ~1 GB again (SmolLM2),
  which made step 2 slower than the steps after it.
- In bf16 at ZeRO 0, DeepSpeed's wrapper steps AdamW once at build to make its state;
  ``_undo_warm_up_step`` takes that step back (step count, moments, decayed fp32 masters).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from skyrl.config.trainer import OptimizerConfig, TrainerConfig


def deepspeed_config(trainer: TrainerConfig, optimizer: OptimizerConfig | None) -> dict[str, Any]:
    """The DeepSpeed JSON config for one role (``optimizer`` None = inference only: ZeRO 1/2
    shard only optimizer and gradient state, which it has none of, and DeepSpeed refuses them
    without an optimizer, so it runs at stage 0; stage 3 still shards its weights)."""
    stage = trainer.zero_stage if optimizer is not None or trainer.zero_stage == 3 else 0
    zero: dict[str, Any] = {"stage": stage}
    offload = trainer.offload_optimizer and optimizer is not None and stage > 0
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if trainer.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": optimizer.max_grad_norm if optimizer else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": trainer.precision == "bf16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if offload:  # else DeepSpeed refuses any client optimizer but its DeepSpeedCPUAdam
        config["zero_force_ds_cpu_optimizer"] = False
    if trainer.precision == "bf16" and optimizer is not None and stage > 0:
        config["data_types"] = {"grad_accum_dtype": "fp32"}  # ZeRO 0 has none (module doc)
    return config


def lr_lambda(optimizer: OptimizerConfig, total_optimizer_steps: int):
    """Multiplier of the peak lr after ``step`` optimizer steps: linear warm-up, then constant or cosine."""
    warmup = optimizer.lr_warmup_steps
    floor = optimizer.min_lr_ratio

    def multiplier(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if optimizer.lr_scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_optimizer_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def build_engine(
    model: nn.Module,
    trainer: TrainerConfig,
    optimizer_cfg: OptimizerConfig | None,
    total_optimizer_steps: int,
):
    """``deepspeed.initialize`` with a torch AdamW and a LambdaLR schedule (or none for inference)."""
    import deepspeed

    config = deepspeed_config(trainer, optimizer_cfg)
    if optimizer_cfg is None:
        engine, *_ = deepspeed.initialize(model=model, config=config)
        return engine
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=optimizer_cfg.lr,
        betas=(optimizer_cfg.betas[0], optimizer_cfg.betas[1]),  # two, checked by the config
        eps=optimizer_cfg.eps,
        weight_decay=optimizer_cfg.weight_decay,
        fused=True,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(optimizer_cfg, total_optimizer_steps)
    )
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
    )
    _undo_warm_up_step(engine.optimizer, optimizer)
    if not (engine.zero_optimization() or engine.bfloat16_enabled()):
        _allocate_adam_state(optimizer)
        _record_grad_norm(engine)
        _skip_lone_allreduce(engine)
    return engine


def _allocate_adam_state(optimizer: torch.optim.AdamW) -> None:
    """Create AdamW's per-parameter state now, exactly as its first step would: one step at
    lr 0 over zero gradients writes zero moments and changes no weight (the update and the
    decoupled weight decay both scale with lr), then the step counts go back to 0. Only for
    an optimizer over the model's own parameters (ZeRO 0, fp32)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if optimizer.state or any(p.grad is not None for p in params):
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    for p in params:
        p.grad = None
        optimizer.state[p]["step"].zero_()


def _undo_warm_up_step(wrapper, optimizer: torch.optim.AdamW) -> None:
    """Take back the AdamW step DeepSpeed took while building the engine, if it took one.

    In bf16 at ZeRO 0 DeepSpeed wraps AdamW in ``FP16_UnfusedOptimizer``, which makes AdamW's
    state by stepping it once over zero gradients at the current lr. That step leaves zero
    moments and no update, but the step count at 1 (the first real update would be AdamW's
    step 2 from empty moments: 0.744 lr instead of lr with eps 1e-8) and the fp32 master
    weights decayed once by ``1 - lr * weight_decay`` while the model's weights were not.
    Here the counts and moments go back to zero and the masters to the model's weights
    (bf16 -> fp32 is exact); the state stays allocated, as ``_allocate_adam_state`` makes it
    for fp32. ZeRO 1-3 and fp32 take no such step."""
    states = [s for s in optimizer.state.values() if "step" in s]
    if not any(float(s["step"]) > 0 for s in states):
        return
    masters = getattr(wrapper, "fp32_groups", None)
    lows = getattr(wrapper, "fp16_groups", None)
    if masters is None or lows is None:
        raise RuntimeError(
            f"DeepSpeed's {type(wrapper).__name__} stepped AdamW while building the engine "
            "and skyrl does not know where its master weights are to undo that step"
        )
    for state in states:
        state["step"].zero_()  # torch's AdamW keeps it as a tensor
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            if key in state:
                state[key].zero_()
    with torch.no_grad():
        for low_group, master_group in zip(lows, masters, strict=True):
            for low, master in zip(low_group, master_group, strict=True):
                master.copy_(low)


def _record_grad_norm(engine) -> None:
    """ZeRO-0 fp32 engines report no grad norm (DeepSpeed's fp32 clipping drops it): store the
    pre-clip norm of the all-reduced gradients as ``optimizer._global_grad_norm``, which
    ``engine.step()`` copies into ``get_global_grad_norm()``.

    With clipping on, that norm also does the clipping: DeepSpeed's ``clip_fp32_gradients``
    would take the norm again, parameter by parameter. Its rule is kept (scale by
    ``max_norm / (norm + 1e-6)`` when that is below 1); after the all-reduce every rank holds
    the same gradients, so its averaging of the norm over ranks changes nothing. The scaling
    is not a pass of its own: torch's fused AdamW divides each gradient by its
    ``grad_scale`` (the attribute ``GradScaler`` sets) as it reads it, so clipping sets that
    to ``(norm + 1e-6) / max_norm`` for the one step (``build_engine``'s AdamW is always
    fused; one that is not refuses a ``grad_scale``); a norm within ``max_norm`` touches no
    gradient at all. SmolLM2 on 2 threads (AVX2 EPYC): clip + fused step 0.17-0.19 s, the
    scaled step 0.14-0.15 s; weights equal to 7.5e-9 after one step at lr 1e-3."""
    optimizer = engine.optimizer
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def record() -> torch.Tensor | None:
        norm = engine._taken_grad_norm
        engine._taken_grad_norm = None
        if norm is None:
            grads = [p.grad for p in params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else None
        optimizer._global_grad_norm = float(norm) if norm is not None else 0.0
        return norm

    engine._taken_grad_norm = None

    max_norm = engine.gradient_clipping()
    if max_norm > 0:

        def record_then_clip() -> None:
            norm = record()
            if norm is not None and float(norm) + 1e-6 > max_norm:
                optimizer.grad_scale = (norm.detach().float() + 1e-6) / max_norm

        def forget_scale(*_args) -> None:
            optimizer.grad_scale = None

        engine.clip_fp32_gradients = record_then_clip
        optimizer.register_step_post_hook(forget_scale)
    else:

        def record_before_step(*_args) -> None:
            record()

        optimizer.register_step_pre_hook(record_before_step)


def final_grad_norm(engine) -> torch.Tensor | None:
    """The total norm of the gradients the next ``step()`` applies, when no all-reduce will
    change them first (one ZeRO-0 fp32 rank): taken here once, and the step's clipping and
    recorded grad norm reuse it. None elsewhere. Call it after the step's last backward; a
    caller that then drops the gradients instead of stepping calls ``forget_grad_norm``."""
    if getattr(engine, "enable_backward_allreduce", True) or not hasattr(
        engine, "_taken_grad_norm"
    ):
        return None
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    engine._taken_grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
    return engine._taken_grad_norm


def forget_grad_norm(engine) -> None:
    """Drop a norm ``final_grad_norm`` took for gradients that will not be stepped."""
    if hasattr(engine, "_taken_grad_norm"):
        engine._taken_grad_norm = None


def _skip_lone_allreduce(engine) -> None:
    """No gradient all-reduce when this ZeRO-0 fp32 engine is the only data-parallel rank (not
    at ZeRO >= 1 or in bf16: there the reduction also moves the gradients into the
    optimizer's own buffers, so it must run even alone)."""
    if engine.dp_world_size == 1:
        engine.enable_backward_allreduce = False
