"""Validation of a composed config: each group's own invariants, then cross-group rules.

Runs right after composition and before anything heavy (Ray, models) starts.
It never mutates the config: it builds typed copies and raises ``ConfigError``
naming the full key path of the first problem.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import sys

from omegaconf import DictConfig, OmegaConf

from skyrl.config.algorithm import ASYNC_TIS_CAP
from skyrl.config.errors import ConfigError, require
from skyrl.config.root import SkyRLConfig
from skyrl.config.structure import check_structure

GROUPS = ("trainer", "generator", "algorithm", "environment", "data", "model")

STEP_WISE_INCOMPATIBLE_ESTIMATORS = ("gae", "reinforce_pp")
"""Estimators that need per-token credit along one sequence, which step-wise splits apart."""

GROUP_BASELINE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
"""Estimators whose baseline is the other samples of the prompt: a group of one gets 0."""


def validate(cfg: DictConfig) -> SkyRLConfig:
    """Check ``cfg`` and return it as typed dataclasses; raise ``ConfigError`` on the first problem."""
    _run_imports(cfg)
    check_structure(cfg)
    for group in GROUPS:
        _check_node(cfg[group], group)
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, SkyRLConfig):  # config.yaml's defaults list skyrl_schema
        raise TypeError(f"the root config is not a SkyRLConfig but {type(typed).__name__}")
    typed.trainer.precision = resolve_precision(typed)
    _check_batch_sizes(typed)
    _check_algorithm(typed)
    _check_fake_steps(typed)
    _check_something_trains(typed)
    _check_weight_sync(typed)
    _check_async(typed)
    _check_lora(typed)
    _check_sinks_and_backend(typed)
    return typed


RESOLVED_KEYS = ("trainer.precision", "algorithm.tis_cap")
"""Keys whose value ``validate`` may decide (``auto`` / unset resolved on the typed copy)."""


def resolve_precision(cfg: SkyRLConfig, cpu_has_amx_bf16: bool | None = None) -> str:
    """``trainer.precision`` with ``auto`` decided: ``bf16`` when the workers train on GPUs
    or on CPUs with AMX-BF16 (measured ~2.8x the fp32 matmul speed there, NOTES-cpu.md),
    else ``fp32`` (bf16 without AVX512-BF16/AMX is a slow fallback). ``cpu_has_amx_bf16``
    None = this machine's CPU, the one the workers run on in a one-node run."""
    t = cfg.trainer
    if t.precision != "auto":
        return t.precision
    if t.num_gpus_per_worker > 0:
        return "bf16"
    if cpu_has_amx_bf16 is None:
        import torch

        cpu_has_amx_bf16 = bool(torch.cpu.get_capabilities().get("amx_bf16", False))
    return "bf16" if cpu_has_amx_bf16 else "fp32"


def with_resolved_values(cfg: DictConfig, typed: SkyRLConfig) -> DictConfig:
    """A copy of ``cfg`` holding the values ``validate`` decided (``RESOLVED_KEYS``), so the
    run directory's ``resolved_config.yaml`` says what the run used."""
    out = cfg.copy()
    for key in RESOLVED_KEYS:
        group, name = key.split(".")
        OmegaConf.update(out, key, getattr(getattr(typed, group), name), force_add=True)
    return out


def _run_imports(cfg: DictConfig) -> None:
    """Import ``cfg.imports``, resolving modules from the working directory too (as
    ``python -m`` would), so ``imports: [recipes.x.loss]`` works from the repo root."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for i, module in enumerate(cfg.get("imports") or []):
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ConfigError(f"imports[{i}]", f"cannot import {module!r}: {exc}") from exc


def _check_node(node: DictConfig, path: str) -> None:
    """Build the node's dataclass (running ``__post_init__``), innermost nodes first."""
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) not in (dict, None):
            _check_node(child, f"{path}.{key!s}")
    if not dataclasses.is_dataclass(OmegaConf.get_type(node)):
        return
    try:
        OmegaConf.to_object(node)
    except ConfigError as exc:
        raise exc.under(path) from None


def _check_batch_sizes(cfg: SkyRLConfig) -> None:
    t = cfg.trainer
    require(
        t.train_batch_size % t.policy_mini_batch_size == 0,
        "trainer.policy_mini_batch_size",
        f"train_batch_size ({t.train_batch_size}) must be divisible by policy_mini_batch_size ({t.policy_mini_batch_size})",
    )
    if cfg.algorithm.uses_critic:
        require(
            t.train_batch_size % t.critic_mini_batch_size == 0,
            "trainer.critic_mini_batch_size",
            f"train_batch_size ({t.train_batch_size}) must be divisible by critic_mini_batch_size ({t.critic_mini_batch_size})",
        )
    # dp_size need not divide a mini-batch's sequences: dispatch pads each mini-batch to a
    # multiple of dp_size with zero-loss rows (skyrl.dispatch.mesh), as step-wise batches
    # of any number of turns need anyway


def weight_sync_path(cfg: SkyRLConfig) -> str:
    """``trainer.weight_sync`` resolved: ``auto`` = ``broadcast`` when the policy and the
    engines each have GPUs (NCCL), else ``shared_memory`` (the trainer falls back to the
    object store when the Ray cluster has more than one node)."""
    mode = cfg.trainer.weight_sync
    if mode != "auto":
        return mode
    if cfg.trainer.num_gpus_per_worker > 0 and cfg.generator.num_gpus_per_engine > 0:
        return "broadcast"
    return "shared_memory"


def _check_weight_sync(cfg: SkyRLConfig) -> None:
    """The broadcast group is NCCL between GPUs or gloo between CPUs, never a mix; NCCL
    cannot put policy rank 0 and an engine on one GPU, so the engines need GPUs of their own.
    Only the broadcast path is built to reach vLLM's tensor-parallel worker processes."""
    path = weight_sync_path(cfg)
    if path != "broadcast":
        tp = cfg.generator.processes_per_engine
        require(
            tp == 1,
            "trainer.weight_sync",
            f"generator.tensor_parallel_size={tp} runs vLLM's model in worker processes, which "
            f"the {path} sync does not reach: set trainer.weight_sync=broadcast "
            "with generator.num_gpus_per_engine",
        )
        return
    policy_gpu = cfg.trainer.num_gpus_per_worker > 0
    engine_gpu = cfg.generator.num_gpus_per_engine > 0
    require(
        policy_gpu == engine_gpu,
        "trainer.weight_sync",
        "broadcast needs the policy workers and the engines both on GPUs (NCCL; engines on "
        "GPUs of their own: generator.num_gpus_per_engine > 0) or both on CPUs (gloo); "
        f"got trainer.num_gpus_per_worker={cfg.trainer.num_gpus_per_worker} and "
        f"generator.num_gpus_per_engine={cfg.generator.num_gpus_per_engine} "
        "(or use trainer.weight_sync=object_store)",
    )


def _check_async(cfg: SkyRLConfig) -> None:
    """Asynchronous training (``trainer.max_staleness > 0``) needs engines that generate while
    the workers train (Ray actors with CPUs or GPUs of their own) and a rollout source; its
    policy loss is corrected for the stale rollouts (``algorithm.tis_cap`` defaults to
    ``ASYNC_TIS_CAP`` there, on the typed copy) unless the user opts out explicitly."""
    t, g, a = cfg.trainer, cfg.generator, cfg.algorithm
    k = t.max_staleness
    if k == 0:
        require(
            not t.partial_rollouts,
            "trainer.partial_rollouts",
            "applies to asynchronous training only (trainer.max_staleness > 0): a synchronous "
            "step has no request in flight when the weights change",
        )
        require(  # nothing else reads it: with tis_cap set the run was corrected anyway
            not a.uncorrected_off_policy,
            "algorithm.uncorrected_off_policy",
            "applies to asynchronous training only (trainer.max_staleness > 0): a synchronous "
            "step trains on rollouts of the current weights, with nothing stale to leave "
            "uncorrected; set it to false",
        )
        return
    require(
        cfg.data.source != "fake",
        "trainer.max_staleness",
        "data=fake has no engine to generate ahead with; use trainer.max_staleness=0",
    )
    require(  # several engines are actors already, with 1 CPU each by default
        g.engines_in_actors,
        "trainer.max_staleness",
        f"{k} generates while the workers train, which needs the engines in Ray actors with "
        "CPUs or GPUs of their own, not one in-process engine: set "
        "generator.num_cpus_per_engine=1 (CPU) or generator.num_gpus_per_engine=1 (GPU)",
    )
    require(
        a.dynamic_sampling != "replace",
        "algorithm.dynamic_sampling",
        "replace is synchronous-only; with trainer.max_staleness > 0 use filter (a dropped "
        "group is replaced by a newly admitted one)",
    )
    if a.uncorrected_off_policy:
        require(
            a.tis_cap is None and a.seq_ratio_bounds is None,
            "algorithm.uncorrected_off_policy",
            "is true but algorithm.tis_cap / algorithm.seq_ratio_bounds set a correction; "
            "drop one of them",
        )
    elif a.tis_cap is None:
        a.tis_cap = ASYNC_TIS_CAP


def _check_lora(cfg: SkyRLConfig) -> None:
    """LoRA adapters (``model.lora.rank`` > 0) served per policy version cannot change under a
    request in flight; the module names are checked against the model by the pre-flight check
    (``skyrl.models.lora.check_target_modules``)."""
    t = cfg.trainer
    if not cfg.model.lora.enabled:
        return
    require(
        not (t.partial_rollouts and t.lora_sync == "adapter"),
        "trainer.partial_rollouts",
        "a request keeps the LoRA adapter it started with, so it cannot continue under new "
        "weights: set trainer.partial_rollouts=false or trainer.lora_sync=merged",
    )


def _check_algorithm(cfg: SkyRLConfig) -> None:
    a = cfg.algorithm
    if cfg.generator.step_wise:
        require(
            a.advantage_estimator not in STEP_WISE_INCOMPATIBLE_ESTIMATORS,
            "algorithm.advantage_estimator",
            f"{a.advantage_estimator!r} cannot be used with generator.step_wise=true (use an outcome estimator such as grpo or rloo)",
        )
    _check_registered_names(a)
    _check_dual_clip(a)
    _check_kl_horizon(cfg)
    from skyrl.rollouts.dynamic_sampling import check_dynamic_filter  # imports the rollout side

    check_dynamic_filter(cfg)
    _check_dynamic_sampling_greedy(cfg)


def _check_dynamic_sampling_greedy(cfg: SkyRLConfig) -> None:
    """The ``reward_variance`` filter drops a group whose samples' rewards are all equal:
    greedy sampling in the agent loop gives a prompt's samples one reply, so every round would
    drop every group (the estimators that compare samples refuse greedy sampling anyway)."""
    a, g = cfg.algorithm, cfg.generator
    if not (a.dynamic_sampling and a.dynamic_filter == "reward_variance"):
        return
    if g.agent != "agent_loop" or cfg.data.source == "fake":
        return
    greedy = {"temperature 0": g.sampling.temperature == 0, "top_k 1": g.sampling.top_k == 1}
    for setting, is_greedy in greedy.items():
        require(
            not is_greedy,
            "algorithm.dynamic_sampling",
            f"{a.dynamic_sampling}: the 'reward_variance' filter keeps groups whose samples' "
            f"rewards differ, and greedy sampling ({setting}) gives every sample of a prompt "
            "the same reply, so every group would be dropped; sample with "
            "generator.sampling.temperature > 0 and top_k -1 or >= 2, or use another "
            "algorithm.dynamic_filter",
        )


def known_total_steps(cfg: SkyRLConfig) -> int | None:
    """``trainer.total_steps``, else epochs x batches of a generated source; None when it
    depends on how many prompts load: a prompt file's length, or the prompts that
    ``data.overlong_prompts=drop`` leaves (the loader counts the kept ones)."""
    t, d = cfg.trainer, cfg.data
    if t.total_steps is not None:
        return t.total_steps
    if d.source == "files" or d.overlong_prompts == "drop":
        return None
    return t.epochs * (d.num_train_prompts // t.train_batch_size)


def check_critic_only_steps(cfg: SkyRLConfig, total_steps: int) -> None:
    """The policy trains at least one of the run's ``total_steps`` steps: the first
    ``trainer.critic_only_steps`` train only the critic. ``validate`` checks it when the
    total is known from the config (``known_total_steps``); the pre-flight check and the
    trainer again once the prompts have loaded and the total is counted."""
    critic_only_steps = cfg.trainer.critic_only_steps
    require(
        critic_only_steps < total_steps,
        "trainer.critic_only_steps",
        f"the policy would never train: {critic_only_steps} critic-only steps of {total_steps}",
    )


def _check_fake_steps(cfg: SkyRLConfig) -> None:
    """``data=fake`` runs ``trainer.epochs`` x (``data.num_train_prompts`` //
    ``trainer.train_batch_size``) steps unless ``trainer.total_steps`` is set: at least one.
    (A generated source's prompt count is the pre-flight's: an eval reads no train prompts.)"""
    t, d = cfg.trainer, cfg.data
    if d.source != "fake":
        return
    require(
        known_total_steps(cfg) != 0,
        "data.num_train_prompts",
        f"{d.num_train_prompts} training prompts, fewer than trainer.train_batch_size="
        f"{t.train_batch_size}: data=fake runs trainer.epochs x ({d.num_train_prompts} // "
        f"{t.train_batch_size}) = 0 steps; set data.num_train_prompts >= {t.train_batch_size} "
        "or trainer.total_steps",
    )


def _check_something_trains(cfg: SkyRLConfig) -> None:
    """Settings under which the policy would never change, or data named and never read."""
    t, g, a, d = cfg.trainer, cfg.generator, cfg.algorithm, cfg.data
    if d.source != "files":
        for key in ("train_files", "eval_files"):
            require(
                not getattr(d, key),
                f"data.{key}",
                f"is only read with data.source=files (source is {d.source!r}): set "
                "data.source=files to train on these files",
            )
    require(
        t.critic_model_path is None or a.uses_critic,
        "trainer.critic_model_path",
        f"is only read with a critic (algorithm.advantage_estimator=gae); "
        f"{a.advantage_estimator!r} trains none: set it to null, or use algorithm=ppo",
    )
    if t.critic_only_steps > 0:
        require(
            a.uses_critic,
            "trainer.critic_only_steps",
            f"counts only with a critic (algorithm.advantage_estimator=gae); with "
            f"{a.advantage_estimator!r} the policy would not train for the first "
            f"{t.critic_only_steps} steps: set it to 0",
        )
        total = known_total_steps(cfg)
        # unknown, or 0 (fewer generated prompts than a step, which the pre-flight's prompt
        # count names): checked once the prompts load (pre-flight, trainer)
        if total:
            check_critic_only_steps(cfg, total)
    # group baselines compare a prompt's samples: identical samples all get advantage 0
    compares_samples = (
        a.advantage_estimator in GROUP_BASELINE_ESTIMATORS
        and g.agent == "agent_loop"
        and d.source != "fake"
    )
    require(
        not (compares_samples and g.n_samples_per_prompt == 1),
        "generator.n_samples_per_prompt",
        f"{a.advantage_estimator!r} compares the samples of a prompt: with 1 sample every "
        "advantage is 0 and nothing trains; set it >= 2 (or use reinforce_pp or gae)",
    )
    greedy = {"temperature 0": g.sampling.temperature == 0, "top_k 1": g.sampling.top_k == 1}
    for setting, is_greedy in greedy.items():
        require(
            not (compares_samples and is_greedy),
            f"generator.sampling.{setting.split()[0]}",
            f"{a.advantage_estimator!r} compares the samples of a prompt: greedy sampling "
            f"({setting}) gives every sample the same reply, so every advantage is 0 and "
            "nothing trains; sample with temperature > 0 and top_k -1 or >= 2",
        )
    k = g.eval_n_samples_per_prompt
    eval_greedy = {
        "temperature 0": g.eval_sampling.temperature == 0,
        "top_k 1": g.eval_sampling.top_k == 1,
    }
    for setting, is_greedy in eval_greedy.items():
        require(
            not (k > 1 and is_greedy and g.agent == "agent_loop"),
            "generator.eval_n_samples_per_prompt",
            f"{k} samples per eval prompt with greedy eval sampling ({setting}) are {k} copies "
            f"of one reply: pass@{k} would equal pass@1 at {k}x the cost; set "
            "generator.eval_sampling.temperature > 0 (top_k -1 or >= 2), or 1 sample",
        )
    require(
        a.overlong_buffer_len < g.max_generate_length,
        "algorithm.overlong_buffer_len",
        f"must be < generator.max_generate_length ({g.max_generate_length}), got "
        f"{a.overlong_buffer_len}: the penalty ramps over the last overlong_buffer_len tokens",
    )


CALLS = {
    "advantage_estimator": "(inputs, cfg)",
    "policy_loss": (
        "(logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg, rollout_logprobs)"
    ),
    "loss_reduction": "(loss_mask, uids, max_seq_len)",
    "kl_estimator": "(logprobs, ref_logprobs)",
}
"""How skyrl calls each registered part of an algorithm (positional arguments)."""


def _check_registered_names(a) -> None:
    """Each part ``algorithm`` names is registered, and can take the call skyrl makes (a
    recipe's wrong signature would otherwise fail inside a worker, mid-step)."""
    from skyrl import algorithms
    from skyrl.registry import unbindable_parameters

    for key, registry in (
        ("advantage_estimator", algorithms.ADVANTAGE_ESTIMATORS),
        ("policy_loss", algorithms.POLICY_LOSSES),
        ("loss_reduction", algorithms.LOSS_REDUCTIONS),
        ("kl_estimator", algorithms.KL_ESTIMATORS),
    ):
        name = getattr(a, key)
        require(
            name in registry,
            f"algorithm.{key}",
            f"unknown {registry.kind} {name!r}; registered: {', '.join(registry.names())}",
        )
        fn, call = registry.get(name), CALLS[key]
        count = call.count(",") + 1
        listed = unbindable_parameters(fn, count)
        require(
            listed is None,
            f"algorithm.{key}",
            f"{registry.kind} {name!r} ({getattr(fn, '__qualname__', fn)}) is called with "
            f"{count} arguments {call}, but it takes ({listed})",
        )


def _check_kl_horizon(cfg: SkyRLConfig) -> None:
    """The adaptive controller multiplies the KL coefficient by ``1 + e * n / kl_horizon`` after
    each step's ``n`` samples, ``e`` clipped to [-0.2, 0.2] (``skyrl.algorithms.kl_controllers``):
    with ``0.2 * n >= kl_horizon`` the factor can reach 0 or flip the coefficient's sign (a
    reward for drifting from the reference)."""
    from skyrl.algorithms.kl_controllers import AdaptiveKLController

    a, t, g = cfg.algorithm, cfg.trainer, cfg.generator
    if not (a.use_kl_in_reward and a.kl_ctrl == "adaptive"):
        return
    clip = AdaptiveKLController.PROPORTIONAL_ERROR_CLIP
    samples = t.train_batch_size * g.n_samples_per_prompt
    require(
        clip * samples < a.kl_horizon,
        "algorithm.kl_horizon",
        f"is {a.kl_horizon} samples, but each step updates the KL coefficient over {samples} "
        f"({t.train_batch_size} prompts x {g.n_samples_per_prompt} samples): the factor 1 + e * "
        f"{samples} / {a.kl_horizon}, e in [-{clip}, {clip}], can reach 0 or flip its sign; set "
        f"it to at least {math.floor(clip * samples) + 1}",
    )


def _check_dual_clip(a) -> None:
    """``clip_ratio_c`` bounds PPO's clipped surrogate (ppo and gspo read it). The built-in
    cispo has no surrogate to bound and would ignore it silently, so it is refused there. A
    recipe's own loss may read it, even one registered over the name ``cispo``: the check is
    on the built-in function, not the name."""
    from skyrl.algorithms import POLICY_LOSSES
    from skyrl.algorithms.policy_losses.cispo import cispo

    if a.clip_ratio_c is None:
        return
    require(
        POLICY_LOSSES.get(a.policy_loss) is not cispo,
        "algorithm.clip_ratio_c",
        f"is ignored by algorithm.policy_loss={a.policy_loss!r}: CISPO has no clipped "
        "surrogate to dual-clip (its IS weight is bounded by eps_clip_low / eps_clip_high); "
        "set it to null, or use policy_loss ppo or gspo",
    )


def _check_sinks_and_backend(cfg: SkyRLConfig) -> None:
    """``trainer.loggers`` and ``generator.backend`` name entries of their registries
    (``skyrl.tracking.SINKS``, ``skyrl.inference.ENGINE_BACKENDS``), a recipe's included."""
    from skyrl.inference.backends import ENGINE_BACKENDS
    from skyrl.tracking import SINKS

    for name in cfg.trainer.loggers:
        require(name in SINKS, "trainer.loggers", SINKS.unknown(name))
    backend = cfg.generator.backend
    require(backend in ENGINE_BACKENDS, "generator.backend", ENGINE_BACKENDS.unknown(backend))
    try:  # only the constructor kwargs: no engine is built
        spec = ENGINE_BACKENDS.get(backend)(cfg.generator, cfg.model.path, cfg.model.tokenizer_path)
    except TypeError as exc:  # e.g. generator=vllm generator.backend=hf
        problem = str(exc)
    else:
        _check_engine_serves_lora(cfg, spec.cls)
        _check_engine_takes_remote_code(cfg, spec.cls)
        return
    # raised outside the handler: known bad input carries no exception context (the CLI
    # fuzz test reads context raised in skyrl's code as a bug)
    raise ConfigError("generator.backend", problem)


def _takes_keyword(engine_cls: type, name: str) -> bool:
    """Whether ``engine_cls(..., name=...)`` is accepted (``make_engine`` passes ``lora`` and
    ``trust_remote_code`` that way)."""
    import inspect

    params = inspect.signature(engine_cls).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check_engine_takes_remote_code(cfg: SkyRLConfig, engine_cls: type) -> None:
    """With ``model.trust_remote_code`` the engine is built with ``trust_remote_code=True``
    (``make_engine``): an engine class that takes no such argument cannot be built."""
    if not cfg.model.trust_remote_code:
        return
    require(
        _takes_keyword(engine_cls, "trust_remote_code"),
        "model.trust_remote_code",
        f"the engine of generator.backend={cfg.generator.backend} ({engine_cls.__name__}) "
        "takes no trust_remote_code argument, so it cannot load a model's own code",
    )


def _check_engine_serves_lora(cfg: SkyRLConfig, engine_cls: type) -> None:
    """With ``trainer.lora_sync=adapter`` the engine is built with ``lora=`` (``make_engine``);
    an engine class that takes no such argument cannot serve the adapter."""
    from skyrl.models.lora import engine_lora

    if engine_lora(cfg) is None:
        return
    require(
        _takes_keyword(engine_cls, "lora"),
        "trainer.lora_sync",
        f"adapter: the engine of generator.backend={cfg.generator.backend} "
        f"({engine_cls.__name__}) takes no lora argument, so it cannot serve a LoRA adapter; "
        "set trainer.lora_sync=merged",
    )
