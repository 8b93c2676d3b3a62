"""The run plan: what one training step will do, derived from the config alone.

``trainer.dry_run=true`` prints it and exits; the trainer logs it at start.
Nothing here starts Ray or loads a model.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from skyrl.batch.budget import GPU_MAX_DEFAULT_TOKENS, micro_batch_tokens
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import known_total_steps
from skyrl.trainer.on_policy import describe, separate_forward_reason


@dataclass(frozen=True)
class RunPlan:
    """Batch arithmetic and world layout of a run."""

    prompts_per_step: int
    trajectories_per_step: int
    step_wise: bool
    max_turns: int
    mini_batches_per_step: int
    optimizer_steps_per_step: int
    """The policy's, on a step it trains."""
    critic_optimizer_steps_per_step: int
    """The critic's (its own mini-batch size), every step; 0 without a critic."""
    micro_batch_max_tokens: int
    gpu_grows_budget: bool
    """Unset on GPU ranks: each grows it from ``micro_batch_max_tokens`` by its free memory."""
    max_seq_len: int
    old_logprobs: str
    total_steps: int | None
    dp_size: int
    roles: dict[str, str]
    engines: str
    overlap_cpus: str | None = None
    """Asynchronous runs on CPUs: the CPUs the policy workers and the engines ask for while
    both compute, when that exceeds this machine's cores (None otherwise)."""
    warm_ups: tuple[str, ...] = ()
    """A line per trained role whose LR warm-up outlasts its schedule (``short_warm_ups``);
    empty when none does or the total depends on a dataset's length."""
    single_turn_tools: str | None = None
    """The ``tools`` environment with one turn: its tool results never reach the model."""


def has_reference_workers(cfg: SkyRLConfig) -> bool:
    """Whether the run builds reference workers: with LoRA the reference is the policy with
    its adapters off (``reference_forward``), on the policy's own workers."""
    return cfg.algorithm.uses_reference and not cfg.model.lora.enabled


def make_plan(cfg: SkyRLConfig) -> RunPlan:
    """Derive the plan; ``total_steps`` is None when it depends on a dataset file's length."""
    t, g, a = cfg.trainer, cfg.generator, cfg.algorithm
    mini_batches = t.train_batch_size // t.policy_mini_batch_size
    worker = f"{t.dp_size} x DeepSpeed ZeRO-{t.zero_stage} {t.precision}"
    lora = cfg.model.lora
    adapters = (
        f", LoRA rank {lora.rank} alpha {lora.alpha:g} on {','.join(lora.target_modules)}"
        if lora.enabled
        else ""
    )
    roles = {"policy": worker + adapters}
    if a.uses_reference and cfg.model.lora.enabled:
        roles["reference"] = "the policy with its LoRA adapters off"
    elif has_reference_workers(cfg):
        roles["reference"] = "colocated with policy" if t.colocate_policy_ref else worker
    if a.uses_critic:
        roles["critic"] = worker
    plan = RunPlan(
        prompts_per_step=t.train_batch_size,
        trajectories_per_step=t.train_batch_size * g.n_samples_per_prompt,
        step_wise=g.step_wise,
        max_turns=g.max_turns,
        mini_batches_per_step=mini_batches,
        optimizer_steps_per_step=mini_batches * t.update_epochs_per_batch,
        critic_optimizer_steps_per_step=(
            t.train_batch_size // t.critic_mini_batch_size * t.update_epochs_per_batch
            if a.uses_critic
            else 0
        ),
        micro_batch_max_tokens=micro_batch_tokens(cfg),
        gpu_grows_budget=t.num_gpus_per_worker > 0 and t.micro_batch_max_tokens is None,
        max_seq_len=g.max_seq_len,
        old_logprobs=describe(cfg, separate_forward_reason(cfg), model_checked=False),
        total_steps=known_total_steps(cfg),
        dp_size=t.dp_size,
        roles=roles,
        engines=(
            "none (data=fake: random rollouts, nothing generates)"
            if cfg.data.source == "fake"
            else f"{g.num_engines} x {g.backend}"
        ),
        overlap_cpus=_overlap_cpus(cfg, _cores()),
        single_turn_tools=_single_turn_tools(cfg),
    )
    if plan.total_steps is None:  # the trainer checks once the prompts have loaded
        return plan
    return dataclasses.replace(plan, warm_ups=tuple(short_warm_ups(cfg, plan, plan.total_steps)))


def _single_turn_tools(cfg: SkyRLConfig) -> str | None:
    """The built-in ``tools`` environment answers a tool call in the next turn: with
    ``generator.max_turns=1`` (the default) every call ends its trajectory unanswered, reward
    0, though the system prompt promises the tools' output."""
    g = cfg.generator
    if cfg.environment.name != "tools" or g.max_turns > 1 or cfg.data.source == "fake":
        return None
    return (
        "environment=tools with generator.max_turns=1: a tool call ends its trajectory before "
        "the tool's result comes back (reward 0); raise generator.max_turns "
        "(experiment=multi_turn_tools uses 3)"
    )


def optimizer_steps(cfg: SkyRLConfig, plan: RunPlan, total_steps: int) -> dict[str, int]:
    """Optimizer steps each trained role takes over ``total_steps`` steps: the length of its LR
    schedule. The policy waits the first ``critic_only_steps``; the critic steps every step,
    by its own mini-batch size."""
    policy_steps = max(0, total_steps - cfg.trainer.critic_only_steps)
    steps = {"policy": policy_steps * plan.optimizer_steps_per_step}
    if plan.critic_optimizer_steps_per_step:
        steps["critic"] = total_steps * plan.critic_optimizer_steps_per_step
    return steps


def short_warm_ups(cfg: SkyRLConfig, plan: RunPlan, total_steps: int) -> list[str]:
    """A warning per trained role whose ``lr_warmup_steps`` outlasts its LR schedule over
    ``total_steps`` steps: its learning rate never reaches ``lr`` (optimizer step ``k``, from
    0, runs at (k + 1) / warm-up of it; ``lr_lambda``)."""
    t = cfg.trainer
    optimizers = {"policy": t.policy_optimizer, "critic": t.critic_optimizer}
    lines = []
    for role, steps in optimizer_steps(cfg, plan, total_steps).items():
        optimizer = optimizers[role]
        if 0 < steps < optimizer.lr_warmup_steps:
            lines.append(
                f"trainer.{role}_optimizer.lr_warmup_steps={optimizer.lr_warmup_steps} outlasts "
                f"the run's {steps} {role} optimizer steps: the learning rate never reaches "
                f"lr={optimizer.lr:g} (its last step runs at "
                f"{steps / optimizer.lr_warmup_steps:.0%} of it)"
            )
    return lines


def _budget(plan: RunPlan) -> str:
    """The micro batch budget row: fixed, or grown by each GPU rank."""
    if plan.gpu_grows_budget and plan.micro_batch_max_tokens < GPU_MAX_DEFAULT_TOKENS:
        return (
            f"{plan.micro_batch_max_tokens}-{GPU_MAX_DEFAULT_TOKENS} tokens, by each GPU "
            f"rank's free memory (max sequence {plan.max_seq_len})"
        )
    return f"{plan.micro_batch_max_tokens} tokens (max sequence {plan.max_seq_len})"


def _optimizer_steps(plan: RunPlan) -> str:
    critic = plan.critic_optimizer_steps_per_step
    return f"{plan.optimizer_steps_per_step}" + (f" (critic {critic})" if critic else "")


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _overlap_cpus(cfg: SkyRLConfig, cores: int) -> str | None:
    """In asynchronous training on CPUs the engines generate while the policy ranks train: when
    their CPUs add up to more than ``cores``, each rank's OpenMP threads share cores with an
    engine and wait on one another at every parallel region (measured with bench_async on 2
    cores: a 2-thread rank beside a 1-CPU engine took 2-3x longer per forward)."""
    t, g = cfg.trainer, cfg.generator
    if t.max_staleness == 0 or t.num_gpus_per_worker > 0 or g.num_gpus_per_engine > 0:
        return None
    workers = t.dp_size * t.num_cpus_per_worker
    per_engine = g.num_cpus_per_engine or 1.0  # several engines at 0: actors of 1 CPU each
    engines = g.num_engines * per_engine
    if workers + engines <= cores:
        return None
    room = cores - engines  # the CPUs the engines leave to the policy ranks
    # a rank runs at least one thread (its whole CPUs), so a fraction would not help
    if room >= t.dp_size:
        fix = f"set trainer.num_cpus_per_worker={int(room // t.dp_size)}"
    elif room >= 1:
        fix = (
            f"each rank runs at least one thread: lower trainer.dp_size to {int(room)} or the "
            "engines' CPUs (generator.num_engines x generator.num_cpus_per_engine)"
        )
    else:
        fix = (
            f"the engines alone take {engines:g} of the {cores} cores: lower "
            "generator.num_engines or generator.num_cpus_per_engine"
        )
    return (
        f"{workers + engines:g} CPUs at once ({t.dp_size} policy x {t.num_cpus_per_worker:g} + "
        f"{g.num_engines} engine x {per_engine:g}) on {cores} cores: threads will "
        f"share cores; {fix}"
    )


def format_plan(plan: RunPlan) -> str:
    """The plan as an aligned, human-readable block."""
    sequences = (
        f"1 to {plan.max_turns} per trajectory (one per LLM turn)"
        if plan.step_wise
        else "1 per trajectory"
    )
    rows = [
        ("prompts / step", f"{plan.prompts_per_step} ({plan.trajectories_per_step} trajectories)"),
        ("training sequences", sequences),
        ("mini-batches / step", f"{plan.mini_batches_per_step} (in prompt units)"),
        ("optimizer steps / step", _optimizer_steps(plan)),
        ("micro batch budget", _budget(plan)),
        ("old logprobs", plan.old_logprobs),
        (
            "total steps",
            "epochs x dataset size / train_batch_size"
            if plan.total_steps is None
            else str(plan.total_steps),
        ),
        *((f"{role} workers", desc) for role, desc in plan.roles.items()),
        ("inference engines", plan.engines),
        *((("warning", plan.overlap_cpus),) if plan.overlap_cpus else ()),
        *((("warning", plan.single_turn_tools),) if plan.single_turn_tools else ()),
        *(("warning", line) for line in plan.warm_ups),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(["skyrl run plan"] + [f"  {name:<{width}}  {value}" for name, value in rows])
