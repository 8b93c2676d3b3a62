"""The pre-flight check: what a validated config points at, checked before Ray, workers or
engines start. ``skyrl.train`` runs it for the dry run and for a real run alike, so
``trainer.dry_run=true`` passes exactly when a run would get past loading.

``validate`` checks the config's values; this checks the things they name:

- ``data.train_files`` / ``data.eval_files`` exist, every row validates (files are streamed),
  and every prompt, train and eval, generated sources too, fits
  ``generator.max_prompt_length`` after the env's ``init`` and the chat template, under
  ``data.overlong_prompts``: ``skyrl.data.load_checked_prompts``'s own code, the function
  the loaders call, so a run drops or rejects what its dry run reported;
- at least ``trainer.train_batch_size`` training prompts remain, and the steps they give
  (epochs x batches) leave the policy some after ``trainer.critic_only_steps``;
- ``model.path`` / ``model.tokenizer_path``, and a critic's ``trainer.critic_model_path``,
  resolve (``skyrl.models.resolve``): a dry run fetches no weights (``locate_model_path``;
  only tokenizer files, which it loads), a real run resolves once and hands the local paths
  on; ``model.path`` and the critic's path are model folders (their configs load); one
  given as a local folder holds its weights (``check_local_weights``; ``skyrl-eval`` and
  ``skyrl-serve`` check ``model.path``'s too, in ``local_model_paths``);
- ``model.path`` is a causal LM (``AutoModelForCausalLM`` builds it, on the meta device) whose
  checkpoint, a local folder's safetensors, names its LM head's weights or ties the head to
  the embedding (not a bare transformer body, not a reward model: tensor names only, read
  from the header or index; ``skyrl-eval`` and ``skyrl-serve`` check this too);
- the environment (``name`` or ``_target_``) imports and builds; ``generator.agent`` imports;
- each built-in logger ``trainer.loggers`` chooses (tensorboard, wandb, mlflow) finds its
  package (``importlib.util.find_spec``: nothing imported; the sink imports it only once the
  workers are up), and ``WANDB_MODE``, when set for wandb, is a mode wandb accepts;
- ``model.lora.target_modules`` name linear layers of the model (built from its config on
  the meta device);
- the model's attention is one skyrl's packed attention computes (no logit softcapping, no
  attention sinks; a critic's too), and no sequence is long enough to change a RoPE that
  transformers derives from a packed row's longest sequence (dynamic NTK, longrope);
- the tokenizer has no id past the model's embedding (``len(tokenizer)`` at most the
  config's ``vocab_size``; a critic's too);
- the longest sequence (``generator.max_prompt_length + generator.max_generate_length``)
  fits the model's context (a critic's too), and ``trainer.micro_batch_max_tokens`` the
  memory estimate of ``skyrl.batch.budget`` (the model's config only).

Only the tokenizer (and, for LoRA or a micro-batch budget, the model's config) is loaded, never the weights. ``data.source=fake`` has no prompts, env or
driver: only its model paths are checked. Every problem raises ``ConfigError`` naming its
key, one line (a model that resolves to nothing too: what was tried, ``;``-separated). A
known kind of bad input (a missing model, an unreadable row) is re-raised outside the
handler that caught it, so the ``ConfigError`` carries no exception context (the CLI fuzz
test reads context raised in skyrl's code as a bug).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skyrl.config.errors import ConfigError, exception_line, require, require_dir
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import check_critic_only_steps, known_total_steps, resolve_precision
from skyrl.data.checked import SPLITS, PromptSplits, SplitReport, check_prompts


@dataclass
class Preflight:
    """What the check found, for the plan and for the run."""

    cfg: SkyRLConfig
    """The config; for a real run with ``model.path`` / ``model.tokenizer_path`` (and a
    critic's ``trainer.critic_model_path``) resolved to local directories (the run uses
    these, resolving nothing again)."""
    prompts: PromptSplits | None
    """A real run's checked rows, for the loaders to use as they are (None: dry run or
    ``data.source=fake``)."""
    reports: list[SplitReport]
    """One per split (none for ``data.source=fake``)."""

    def plan_rows(self) -> list[tuple[str, str]]:
        """``(name, value)`` rows for the printed plan: prompt counts, dropped counts, when
        the eval runs."""
        if not self.reports:
            return [("eval", "none (data.source=fake has no prompts)")]
        counts = ", ".join(f"{r.split} {r.num_prompts}" for r in self.reports)
        longest = max(r.max_prompt_tokens for r in self.reports)
        limit = self.cfg.generator.max_prompt_length
        rows = [("prompts", f"{counts} (longest {longest} tokens, max_prompt_length {limit})")]
        if self.cfg.data.overlong_prompts == "drop":
            dropped = ", ".join(f"{r.split} {r.num_dropped}" for r in self.reports)
            rows.append(("over-long prompts", f"dropped: {dropped} (data.overlong_prompts=drop)"))
        return [*rows, ("eval", self._eval_row())]

    def _eval_row(self) -> str:
        """The eval prompts and the steps they run after, or why there are none (then
        ``trainer.eval_before_train`` and ``eval_interval`` evaluate nothing)."""
        t, d = self.cfg.trainer, self.cfg.data
        report = next(r for r in self.reports if r.split == "eval")
        if report.num_prompts == 0:
            if report.num_dropped:
                were = "prompts were" if report.num_dropped > 1 else "prompt was"
                why = f"its {report.num_dropped} {were} dropped as over-long"
            elif d.source == "files":
                why = "data.eval_files is empty"
            else:
                why = "data.num_eval_prompts=0"
            asked = [key for key, on in (("trainer.eval_before_train", t.eval_before_train),
                                         ("trainer.eval_interval", t.eval_interval)) if on]  # fmt: skip
            verb = "evaluates" if len(asked) == 1 else "evaluate"
            return f"none ({why})" + (f": {' and '.join(asked)} {verb} nothing" if asked else "")
        when = ["before the first step"] if t.eval_before_train else []
        if t.eval_interval:
            when.append("every step" if t.eval_interval == 1 else f"every {t.eval_interval} steps")
        last = "after the last step" if not when else f"{', '.join(when)} and after the last step"
        samples = self.cfg.generator.eval_n_samples_per_prompt
        return f"{report.num_prompts} prompts x {samples} samples, {last}"


def preflight(cfg: SkyRLConfig, for_run: bool) -> Preflight:
    """Check everything ``cfg`` names that can be checked without starting anything; raise
    on the first problem. ``for_run``: resolve the model paths for good (downloading if
    needed) and keep the checked rows; else (the dry run) fetch no weights and only count."""
    fake = cfg.data.source == "fake"
    _check_logger_packages(cfg)
    _check_wandb_mode(cfg)
    if not fake:
        check_files_exist(cfg)
        check_env_and_agent(cfg)
    if for_run:
        _check_gpus(cfg)
    resolved, tokenizer_dir = _model_paths(cfg, fetch=for_run)
    model_config = _model_config(resolved, for_run)
    if model_config is not None:
        _check_causal_lm(resolved, _model_dir(resolved, for_run))
        _check_packed_forward(resolved, model_config, "model.path", resolved.model.path)
    check_local_weights(cfg.model.path, "model.path")
    critic_config = _check_critic_model(resolved, for_run)
    _check_critic_weights(cfg)
    _check_lora_modules(resolved, for_run)
    if model_config is not None:  # the longest sequence, the micro batch budget's memory
        from skyrl.batch.budget import check_micro_batch_budget

        check_micro_batch_budget(resolved, model_config)
    if fake:
        return Preflight(resolved, None, [])
    tokenizer = load_tokenizer(cfg, tokenizer_dir)
    check_vocab_size(cfg, len(tokenizer), model_config, critic_config)
    splits = PromptSplits([], []) if for_run else None
    reports = [
        check_prompts(cfg, split, tokenizer, getattr(splits, split).append if splits else None)
        for split in SPLITS
    ]
    _check_enough_train_prompts(cfg, reports[0])
    _check_critic_only_steps(cfg, reports[0])
    return Preflight(resolved, splits, reports)


def _check_logger_packages(cfg: SkyRLConfig) -> None:
    """Each built-in sink ``trainer.loggers`` chooses finds its optional package (a recipe's
    sink registered under a built-in name needs what it imports itself, unchecked)."""
    import importlib.util

    from skyrl.tracking import SINKS
    from skyrl.tracking.mlflow import MlflowSink
    from skyrl.tracking.sink import install_hint
    from skyrl.tracking.tensorboard import TensorBoardSink
    from skyrl.tracking.wandb import WandbSink

    packages: dict[object, str] = {
        TensorBoardSink: "tensorboard",
        WandbSink: "wandb",
        MlflowSink: "mlflow",
    }
    for logger in cfg.trainer.loggers:
        package = packages.get(SINKS.get(logger)) if logger in SINKS else None
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError("trainer.loggers", install_hint(package, logger))


WANDB_MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")
"""The values of ``WANDB_MODE`` wandb accepts (its ``Settings.mode``; compared exactly)."""


def _check_wandb_mode(cfg: SkyRLConfig) -> None:
    """A ``WANDB_MODE`` set for the built-in wandb sink is one of ``WANDB_MODES``: wandb
    refused any other only once the workers were up (a recipe's own sink under the name
    ``wandb`` reads what it likes)."""
    import os

    from skyrl.tracking import SINKS
    from skyrl.tracking.wandb import WandbSink

    mode = os.environ.get("WANDB_MODE")
    if mode is None or "wandb" not in cfg.trainer.loggers or SINKS.get("wandb") is not WandbSink:
        return
    require(
        mode in WANDB_MODES,
        "trainer.loggers",
        f"logger 'wandb' would not start with WANDB_MODE={mode!r}: wandb's modes are "
        f"{', '.join(WANDB_MODES)} (unset WANDB_MODE: offline)",
    )


def check_run_dir(cfg: SkyRLConfig, out: Path) -> Path | None:
    """The run directory ``out`` before anything is written to it: not a file (nor under
    one); the checkpoint ``trainer.resume`` names is complete (its ``trainer_state.json``
    parses and has a step, its policy weights are there, its files at their saved sizes) and
    fits the run (its ZeRO stage's file layout, its precision, its dp_size, its asynchronous
    prompts, its LoRA adapters or full weights); a fresh run
    (``trainer.resume=none``) is not pointed at an earlier run's checkpoints, which it would
    overwrite and prune as it goes. Returns the checkpoint to resume from (None: fresh)."""
    from skyrl.trainer.checkpoint import (
        TRAINER_STATE,
        CheckpointManager,
        check_resumable,
        resolve_resume,
    )

    require_dir(out, "trainer.output_dir")
    t = cfg.trainer
    manager = CheckpointManager(out / "checkpoints", t.max_ckpts_to_keep)
    if t.resume == "none":
        earlier = ", ".join(f"global_step_{s}" for s in manager.steps())
        require(
            not earlier,
            "trainer.resume",
            f"trainer.resume=none, but {out} holds checkpoints of an earlier run ({earlier}) "
            "that a fresh run would overwrite and prune: set trainer.resume=auto to continue "
            "it, or another trainer.output_dir",
        )
        return None
    try:
        ckpt = resolve_resume(t.resume, manager)
    except ValueError as exc:  # not a checkpoint, or `latest` naming an incomplete one
        problem = str(exc)
    else:
        if ckpt is not None:
            state = _check_checkpoint(ckpt, TRAINER_STATE)
            _check_critic_saved(cfg, ckpt)
            # its files as saved (a missing rng_rank1.pt is "missing", not another dp_size)
            check_resumable(ckpt, state, t.zero_stage, resolve_precision(cfg))
            _check_resume_mode(cfg, ckpt, state)
            _check_dp_size(cfg, ckpt)
            _check_lora_matches(cfg, ckpt)
        if t.resume == "auto" and manager.steps() and not (manager.root / "latest").is_file():
            _note_unpublished(manager, ckpt)
        return ckpt
    raise ConfigError("trainer.resume", problem)


def _check_critic_saved(cfg: SkyRLConfig, ckpt: Path) -> None:
    """A run with a critic resumes only a checkpoint that holds one (its workers would fail
    to load the missing folder, blamed on the model or the ZeRO stage)."""
    estimator = cfg.algorithm.advantage_estimator
    require(
        not cfg.algorithm.uses_critic or (ckpt / "critic").is_dir(),
        "trainer.resume",
        f"{ckpt} has no critic (no {ckpt / 'critic'}): it was saved by a run without one, and "
        f"algorithm.advantage_estimator={estimator} needs one; resume it with the algorithm it "
        "was saved with, or start this run in another trainer.output_dir",
    )


def _note_unpublished(manager, ckpt: Path | None) -> None:
    """``trainer.resume=auto`` found checkpoints but no ``latest`` naming one: a run killed
    after its first save but before it logged that step (a checkpoint is published only
    then), or the pointer was deleted. The run continues from the newest complete one
    (``resolve_resume``; a fresh run replaced them all as it reached their steps), or starts
    fresh when none is complete: say which, once."""
    import sys

    from skyrl.trainer.checkpoint import TRAINER_STATE

    names = ", ".join(f"global_step_{s}" for s in manager.steps())
    if ckpt is not None:
        then = (
            f"resuming from the newest complete one, {ckpt} (to start fresh instead, use "
            "another trainer.output_dir)"
        )
    else:
        then = (
            f"none is complete (no {TRAINER_STATE}, or files cut short): this run starts "
            "fresh and replaces them"
        )
    print(
        f"warning: trainer.resume=auto: {manager.root} holds {names} but no 'latest' pointer (a "
        f"run stopped before it published them, or the pointer was removed): {then}",
        file=sys.stderr,
        flush=True,
    )


def _state_problem(state: object, state_file: Path) -> str:
    """What a parsed trainer state lacks of what a resume reads as numbers (its ``step`` a
    whole number, its ``kl_coef`` a number), or ``""``."""
    if not isinstance(state, dict) or "step" not in state:
        return f"{state_file} has no 'step'"
    step, kl_coef = state["step"], state.get("kl_coef")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"{state_file}: 'step' is {step!r}, not a step number"
    if isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float)):
        return f"{state_file}: 'kl_coef' is {kl_coef!r}, not a number"
    return ""


def start_row(ckpt: Path | None) -> tuple[str, str]:
    """The plan's row saying where a run starts: fresh, or the checkpoint ``check_run_dir``
    found to resume (and the step it was saved after)."""
    import json

    from skyrl.trainer.checkpoint import TRAINER_STATE

    if ckpt is None:
        return ("start", "fresh")
    step = json.loads((ckpt / TRAINER_STATE).read_text())["step"]
    return ("start", f"resumes {ckpt} (saved after step {step})")


def _check_checkpoint(ckpt: Path, state_name: str) -> dict:
    """A checkpoint to resume from: its trainer state parses and has a step number and a KL
    coefficient; its policy weights are there. Returns the trainer state."""
    import json

    state_file = ckpt / state_name
    try:
        state = json.loads(state_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = f"{state_file} is not valid JSON ({exception_line(exc)})"
    else:
        problem = _state_problem(state, state_file)
    require(not problem, "trainer.resume", problem)
    require(
        (ckpt / "policy").is_dir(),
        "trainer.resume",
        f"{ckpt} has no policy weights (no {ckpt / 'policy'})",
    )
    return state


def _check_dp_size(cfg: SkyRLConfig, ckpt: Path) -> None:
    """The checkpoint was saved by ``trainer.dp_size`` ranks (one ``rng_rank<r>.pt`` each):
    every rank loads its own RNG state and, under ZeRO 1-3, its own optimizer partition, which
    DeepSpeed finds by rank, failing or mis-loading on another number of ranks."""
    dp_size = cfg.trainer.dp_size
    ranks = len(list((ckpt / "policy").glob("rng_rank*.pt")))
    require(
        ranks > 0,
        "trainer.resume",
        f"{ckpt}: no rng_rank*.pt in {ckpt / 'policy'}: not a complete checkpoint",
    )
    require(
        ranks == dp_size,
        "trainer.dp_size",
        f"{ckpt} was saved by {ranks} data-parallel rank{'' if ranks == 1 else 's'} "
        f"({ranks} rng_rank*.pt in {ckpt / 'policy'}), but trainer.dp_size={dp_size}: a "
        f"checkpoint resumes on the number of ranks that saved it (trainer.dp_size={ranks})",
    )


def _check_lora_matches(cfg: SkyRLConfig, ckpt: Path) -> None:
    """A LoRA checkpoint (``policy/adapter_config.json``) resumes with the adapters it saved
    (rank, alpha, target modules; dropout may change), a full-weights one without LoRA. The
    workers load adapters by name and leniently (the frozen base is not saved), so other
    targets of the same shapes loaded silently: fresh adapters, or the saved ones on other
    modules; another alpha rescaled the trained policy."""
    import json

    lora, adapter = cfg.model.lora, ckpt / "policy" / "adapter_config.json"
    if not adapter.is_file():
        require(
            lora.rank == 0,
            "model.lora.rank",
            f"{ckpt} holds full weights (no adapter_config.json in {ckpt / 'policy'}), but "
            f"model.lora.rank={lora.rank} trains adapters: resume with model.lora.rank=0",
        )
        return
    try:
        saved = json.loads(adapter.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = f"{adapter} is not valid JSON ({exception_line(exc)})"
        raise ConfigError("trainer.resume", problem) from None
    require(
        lora.rank > 0,
        "model.lora.rank",
        f"{ckpt} holds LoRA adapters (rank {saved.get('r')}), but model.lora.rank=0 trains the "
        "full weights: resume with the model.lora settings it was trained with",
    )
    targets = saved.get("target_modules")  # PEFT saves them as a set: compare sets
    saved_targets = sorted(set([targets] if isinstance(targets, str) else targets or []))
    for key, was, now in (
        ("model.lora.rank", saved.get("r"), lora.rank),
        ("model.lora.alpha", saved.get("lora_alpha"), lora.alpha),
        ("model.lora.target_modules", saved_targets, sorted(set(lora.target_modules))),
    ):
        shown = (lambda v: f"[{','.join(v)}]") if isinstance(now, list) else str
        require(
            was == now,
            key,
            f"{ckpt} trained adapters with {key}={shown(was)}, but this run asks for "
            f"{shown(now)}: a checkpoint resumes with the adapters it saved ({key}={shown(was)})",
        )


def _check_resume_mode(cfg: SkyRLConfig, ckpt: Path, state: dict) -> None:
    """An asynchronous run's checkpoint with prompts in flight resumes asynchronously: a
    synchronous run draws from the loader's position and would never train those prompts."""
    rollouts = state.get("rollouts")
    pending = rollouts.get("pending") if isinstance(rollouts, dict) else None
    require(
        not pending or cfg.trainer.max_staleness > 0,
        "trainer.max_staleness",
        f"{ckpt} was saved by an asynchronous run with {len(pending or [])} prompts in flight, "
        "which a synchronous run (max_staleness=0) would skip: resume with "
        "trainer.max_staleness >= 1",
    )


def check_env_and_agent(cfg: SkyRLConfig) -> None:
    """The environment (``name`` or ``_target_``) imports and builds; ``generator.agent``
    imports; ``generator.tool_parser`` is one of vLLM's (``skyrl-eval`` checks these too)."""
    from skyrl.envs import make_checked_env
    from skyrl.generators.tool_calls import check_tool_parser

    make_checked_env(cfg.environment).close()
    _check_agent(cfg.generator.agent)
    check_tool_parser(cfg.generator.tool_parser)
    from skyrl.serve.harness import check_external_agent, is_external_agent

    if is_external_agent(cfg.generator.agent):
        check_external_agent(cfg)


def visible_gpus() -> int:
    """GPUs this machine's CUDA sees."""
    import torch

    return torch.cuda.device_count()


def _check_gpus(cfg: SkyRLConfig) -> None:
    """A run that asks for GPUs has some: on a machine without any, Ray would wait for the
    bundle and time out naming no key. On a cluster (``RAY_ADDRESS``) they are Ray's to place."""
    import os

    if os.environ.get("RAY_ADDRESS"):
        return
    for key, value in (
        ("trainer.num_gpus_per_worker", cfg.trainer.num_gpus_per_worker),
        ("generator.num_gpus_per_engine", cfg.generator.num_gpus_per_engine),
    ):
        require(
            value <= 0 or visible_gpus() > 0,
            key,
            f"{key}={value:g} asks for GPUs, but this machine has none (and RAY_ADDRESS "
            "names no cluster)",
        )


def _model_dir(cfg: SkyRLConfig, for_run: bool) -> str | None:
    """The local folder of ``model.path`` (a run's is resolved already); None for a dry run of
    a model not on disk yet (the run checks it)."""
    from skyrl.models.resolve import locate_model_path

    return cfg.model.path if for_run else locate_model_path(cfg.model.path)


def _model_config(cfg: SkyRLConfig, for_run: bool):
    """The language model's config of ``model.path``, loaded once for the checks that read
    it; None for a dry run of a model not on disk yet (the run checks it). A folder without a
    model config is a ``ConfigError``."""
    model_dir = _model_dir(cfg, for_run)
    if not model_dir:
        return None
    return model_text_config(model_dir, "model.path", cfg.model.trust_remote_code)


def _check_causal_lm(cfg: SkyRLConfig, model_dir: str | None) -> None:
    """``model.path`` (its local folder ``model_dir``; None: not on disk yet, the run checks it)
    is a causal LM whose checkpoint holds its LM head's weights or ties the head to its
    embedding. Another kind of model (a T5) stopped the checks that read the config's context
    with a traceback; a bare transformer body or a reward model passed, and the policy worker
    refused it only once everything had started (the hf engine served a random head). Built
    on the meta device and read from the checkpoint's tensor names, never its weights (a
    config that does not load is left to ``model_text_config``)."""
    if not model_dir:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from skyrl.workers.models import missing_lm_head

    trust_remote_code = cfg.model.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except Exception:  # none, or a broken one: the config's own check says so
        return
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as exc:  # no causal LM class for the config (the workers' load fails)
        problem: str | None = f"{model_dir} is not a causal LM: {exception_line(exc)}"
    except Exception:  # a model's own code that will not build on the meta device: its load
        return  # says what is wrong, the head's weights checked there too
    else:
        problem = missing_lm_head(model, model_dir)
    require(problem is None, "model.path", problem or "")


def _check_critic_model(cfg: SkyRLConfig, for_run: bool):
    """A critic's own ``trainer.critic_model_path`` is a model folder (the critic worker loads
    it) of a decoder-only model whose packed forward is right and whose context holds the
    longest sequence; a dry run of a model not on disk yet skips this, the run checks it.
    Returns the critic's (text) config, for ``check_vocab_size`` (None: no critic of its own,
    or not on disk yet)."""
    from skyrl.models.resolve import CRITIC_KEY, critic_model_path, locate_model_path

    critic = critic_model_path(cfg)
    if critic is None:  # no critic, or one that starts from model.path (checked above)
        return None
    folder = critic if for_run else locate_model_path(critic, CRITIC_KEY)
    if not folder:
        return None
    from skyrl.batch.budget import check_activation_memory, check_context

    model_config = model_text_config(folder, CRITIC_KEY, cfg.model.trust_remote_code)
    require(  # its AutoModel wants decoder inputs, and its config has no context to check
        not getattr(model_config, "is_encoder_decoder", False),
        CRITIC_KEY,
        f"{folder} ({model_config.model_type}) is an encoder-decoder model: the critic is a "
        "decoder-only transformer body with a value head (a causal LM's or a reward model's)",
    )
    _check_packed_forward(cfg, model_config, CRITIC_KEY, folder)
    check_context(cfg, model_config, f"the critic's context ({CRITIC_KEY})")
    check_activation_memory(cfg, model_config, CRITIC_KEY)
    return model_config


def check_vocab_size(cfg: SkyRLConfig, num_tokens: int, model_config, critic_config) -> None:
    """Every id of the tokenizer (``num_tokens``: ``len(tokenizer)``, added tokens included)
    has a row in the embedding of ``model.path`` and of a critic's own
    ``trainer.critic_model_path`` (their configs' ``vocab_size``; None: not on disk yet, the
    run checks it): a larger tokenizer passed and the workers failed on the first id past
    the embedding. A smaller one is fine: models pad their vocab (Qwen2.5: 151936 rows for
    151665 tokens)."""
    from skyrl.models.resolve import CRITIC_KEY

    tokenizer_key = "model.tokenizer_path" if cfg.model.tokenizer_path else "model.path"
    for key, config in (("model.path", model_config), (CRITIC_KEY, critic_config)):
        vocab_size = getattr(config, "vocab_size", None)
        if not isinstance(vocab_size, int) or num_tokens <= vocab_size:
            continue
        raise ConfigError(
            tokenizer_key if key == "model.path" else key,
            f"the tokenizer ({tokenizer_key}) has {num_tokens} tokens, added ones included, "
            f"but {key}'s vocab_size is {vocab_size}: ids {vocab_size} to {num_tokens - 1} "
            "have no embedding row",
        )


def _check_critic_weights(cfg: SkyRLConfig) -> None:
    """A critic's own ``trainer.critic_model_path``, given as a local folder, holds weights."""
    from skyrl.models.resolve import CRITIC_KEY, critic_model_path

    critic = critic_model_path(cfg)
    if critic is not None:
        check_local_weights(critic, CRITIC_KEY)


def check_local_weights(path: str, key: str) -> None:
    """The model ``path`` (config key ``key``) names, when it is a local folder, holds its
    weights: transformers' ``model.safetensors`` / ``pytorch_model.bin`` (which it loads before
    any index), else every shard some ``*.index.json`` names, else (no index) any
    ``*.safetensors`` / ``*.bin`` file. What a hub id, ``skyrl-tiny`` or the converted
    SmolLM2 resolve to is checked by its resolver (``skyrl.models.resolve``: the same rule,
    less the first clause, for a hub snapshot). A folder without ``config.json`` is left to
    the config's own check (``model_text_config``; ``skyrl-serve``'s after the tokenizer's)."""
    from skyrl.models.resolve import has_weights, local_path

    found = local_path(path)
    folder = Path(found) if found is not None else None
    single = ("model.safetensors", "pytorch_model.bin")
    if folder is None or not (folder / "config.json").is_file():
        return
    if any((folder / name).is_file() for name in single) or has_weights(folder):
        return
    indexes = sorted(p.name for p in folder.glob("*.index.json"))
    if indexes:
        problem = f"{folder}: not every weight shard {' or '.join(indexes)} names is there"
    else:
        problem = f"{folder} holds no weights (no *.safetensors or *.bin file)"
    raise ConfigError(key, problem)


def _check_packed_forward(cfg: SkyRLConfig, model_config, key: str, name: str) -> None:
    """The workers' packed forward computes the model ``key`` names (``name``, its (text)
    config ``model_config``): its attention is one skyrl's packed attention implements
    (``unimplemented_attention``), no sequence passes the chunk of chunked-attention layers
    under ``per_sequence`` (``_attention_chunk``), and none reaches the length past which its
    RoPE would change with the longest sequence of a packed row (``_length_dependent_rope``)."""
    from skyrl.workers.packed_attention import unimplemented_attention

    problem = unimplemented_attention(name, model_config)
    if problem is not None:
        raise ConfigError(key, f"{problem}: the workers would compute another model's logprobs")
    g = cfg.generator
    chunk = _attention_chunk(model_config)
    if cfg.trainer.packed_attention == "per_sequence" and chunk and g.max_seq_len > chunk:
        raise ConfigError(
            "trainer.packed_attention",
            f"{name} ({model_config.model_type}) attends within chunks of attention_chunk_size "
            f"= {chunk} tokens on its chunked layers, which trainer.packed_attention="
            "per_sequence does not apply: a sequence of up to generator.max_prompt_length + "
            f"generator.max_generate_length = {g.max_prompt_length} + "
            f"{g.max_generate_length} = {g.max_seq_len} tokens would attend across chunks; use "
            "trainer.packed_attention=masked (transformers' chunked mask), or keep the sum at "
            f"most {chunk}",
        )
    rope = _length_dependent_rope(model_config)
    if rope is None or g.max_seq_len <= rope[1]:
        return
    rope_type, limit, source = rope
    raise ConfigError(
        "generator.max_generate_length",
        "a sequence of up to generator.max_prompt_length + generator.max_generate_length = "
        f"{g.max_prompt_length} + {g.max_generate_length} = {g.max_seq_len} tokens exceeds "
        f"{limit} (the model's {source}), past which its {rope_type} RoPE changes its "
        "frequencies with the longest sequence of a packed micro batch (transformers reads the "
        "row's largest position id): the sequences packed beside such a one would be scored "
        f"with its frequencies, not their own; keep the sum at most {limit}",
    )


def _attention_chunk(model_config) -> int | None:
    """``attention_chunk_size`` of a config with chunked-attention layers (Llama 4's: a query
    sees only the keys of its own chunk of that many positions); None without such layers."""
    layer_types = getattr(model_config, "layer_types", None) or ()
    chunk = getattr(model_config, "attention_chunk_size", None)
    return chunk if "chunked_attention" in layer_types and isinstance(chunk, int) else None


def _length_dependent_rope(model_config) -> tuple[str, int, str] | None:
    """``(rope_type, length, config field)`` of a RoPE whose frequencies transformers derives
    from ``max(position_ids) + 1``, over a packed row the longest sequence in it, and the
    length past which they change (None: the config alone fixes them). Dynamic NTK rescales
    past ``max_position_embeddings`` (its ``seq_len`` is at least that), longrope takes its
    long factors past ``original_max_position_embeddings``. Below that length the frequencies
    are the config's whatever a row holds; a config without those lengths has none to check."""
    context = getattr(model_config, "max_position_embeddings", None)
    rope = getattr(model_config, "rope_parameters", None)  # transformers 5; 4: rope_scaling
    rope = rope or getattr(model_config, "rope_scaling", None) or {}
    layers = [rope] if "rope_type" in rope or "type" in rope else list(rope.values())
    found: list[tuple[str, int, str]] = []
    for params in (p for p in layers if isinstance(p, dict)):  # one, or one per layer type
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        if "dynamic" in rope_type and context:  # as transformers' dynamic_rope_update tells
            found.append((rope_type, int(context), "max_position_embeddings"))
        elif rope_type == "longrope":  # Phi-3 keeps the original length beside the dict
            original = params.get("original_max_position_embeddings") or getattr(
                model_config, "original_max_position_embeddings", None
            )
            length = original or context
            if length:
                found.append((rope_type, int(length), "original_max_position_embeddings"))
    return min(found, key=lambda rope: rope[1]) if found else None


def model_text_config(model_dir: str, key: str, trust_remote_code: bool):
    """The language model's config in ``model_dir``; a folder without one (a LoRA adapter
    directory among them) is a ``ConfigError`` on ``key``."""
    from skyrl.batch.budget import text_config
    from skyrl.models.lora import is_adapter_dir

    if is_adapter_dir(model_dir):  # a LoRA run's final_adapter
        problem = (
            f"{model_dir} is a LoRA adapter directory, not a model: name a model folder, e.g. "
            "its run's final_hf (these adapters merged into their base model)"
        )
        raise ConfigError(key, problem)
    try:
        return text_config(model_dir, trust_remote_code)
    except Exception as exc:  # no config.json, a broken one, an unknown model type, a file
        problem = f"{model_dir} is not a model folder: {exception_line(exc)}"
    raise ConfigError(key, problem)


def _check_lora_modules(cfg: SkyRLConfig, for_run: bool) -> None:
    """``model.lora.target_modules`` name linear layers of the model, and a vLLM engine that
    is to serve the adapters supports LoRA on its architecture (its config only; a dry run of
    a model not on disk yet skips this, the run checks it)."""
    from skyrl.models.lora import check_target_modules

    lora = cfg.model.lora
    if not lora.enabled:
        return
    model_dir = _model_dir(cfg, for_run)
    if not model_dir:
        return
    check_target_modules(lora, model_dir, cfg.model.trust_remote_code)
    if cfg.generator.backend == "vllm" and cfg.trainer.lora_sync == "adapter":
        from skyrl.inference.vllm_engine import check_serves_lora  # imports vllm: only here

        check_serves_lora(model_dir, cfg.model.trust_remote_code)


def local_model_paths(cfg: SkyRLConfig) -> SkyRLConfig:
    """``cfg`` with ``model.path`` / ``model.tokenizer_path`` resolved to local directories
    (fetched if needed); one that names nothing, or a local ``model.path`` folder without
    weights, or one that is no causal LM or has no LM head's weights, is a one-line
    ``ConfigError``. A critic's ``trainer.critic_model_path`` is left as it is: evaluation
    and serving load no critic."""
    resolved = _model_paths(cfg, fetch=True, critic=False)[0]
    check_local_weights(cfg.model.path, "model.path")
    _check_causal_lm(resolved, resolved.model.path)
    return resolved


def check_files_exist(cfg: SkyRLConfig, splits: tuple[str, ...] = SPLITS) -> None:
    """Every prompt file of ``splits`` exists (a stat each: before the slower checks;
    ``skyrl-eval`` checks the eval split)."""
    if cfg.data.source != "files":
        return
    for split in splits:
        for i, path in enumerate(getattr(cfg.data, f"{split}_files")):
            require(Path(path).exists(), f"data.{split}_files[{i}]", f"{path}: file not found")


def _check_agent(name: str) -> None:
    """``generator.agent`` names a built-in driver or an importable factory."""
    from skyrl.generators.generator import driver_factory

    try:
        driver_factory(name)
        return
    except ConfigError:
        raise
    except Exception as exc:  # the module imported but raised
        problem = f"importing {name!r} raised {exception_line(exc)}"
    raise ConfigError("generator.agent", problem)


def _model_paths(cfg: SkyRLConfig, fetch: bool, critic: bool = True) -> tuple[SkyRLConfig, str]:
    """The config to run with and the tokenizer's local directory (``critic``: a critic's
    path too); a path that names nothing is a one-line ``ConfigError`` (what was tried
    included)."""
    from skyrl.models.resolve import ModelNotFoundError

    try:
        return _resolve_model_paths(cfg, fetch, critic)
    except ModelNotFoundError as exc:
        missing = exc
    raise ConfigError(missing.key, missing.one_line())  # raised here: no exception context


def _resolve_model_paths(cfg: SkyRLConfig, fetch: bool, critic: bool) -> tuple[SkyRLConfig, str]:
    from skyrl.models.resolve import (
        CRITIC_KEY,
        critic_model_path,
        locate_model_path,
        resolve_tokenizer_path,
        with_local_model_paths,
    )

    if fetch:
        resolved = with_local_model_paths(cfg, critic)
        assert resolved.model.tokenizer_path is not None  # with_local_model_paths sets it
        return resolved, resolved.model.tokenizer_path
    model_dir = locate_model_path(cfg.model.path)
    if cfg.model.tokenizer_path:
        tokenizer_dir = resolve_tokenizer_path(cfg.model.tokenizer_path)
    else:
        tokenizer_dir = model_dir or resolve_tokenizer_path(cfg.model.path, key="model.path")
    critic_path = critic_model_path(cfg) if critic else None
    if critic_path is not None:
        locate_model_path(critic_path, CRITIC_KEY)
    return cfg, tokenizer_dir


def load_tokenizer(cfg: SkyRLConfig, folder: str):
    """The tokenizer in the local ``folder``; one that does not load is a ``ConfigError``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as exc:  # a folder without tokenizer files, a broken tokenizer.json, ...
        problem = f"cannot load a tokenizer from {folder}: {exception_line(exc)}"
    raise ConfigError("model.tokenizer_path" if cfg.model.tokenizer_path else "model.path", problem)


def _check_critic_only_steps(cfg: SkyRLConfig, train: SplitReport) -> None:
    """``trainer.critic_only_steps`` against the run's steps, counted as the trainer will
    (epochs x batches of the kept training prompts) where ``validate`` could not: a prompt
    file's length, or the prompts ``data.overlong_prompts=drop`` leaves."""
    total_steps = known_total_steps(cfg)
    if total_steps is None:
        t = cfg.trainer
        total_steps = t.epochs * (train.num_prompts // t.train_batch_size)
    check_critic_only_steps(cfg, total_steps)


def _check_enough_train_prompts(cfg: SkyRLConfig, train: SplitReport) -> None:
    """A step draws ``trainer.train_batch_size`` prompts: the training set must hold them."""
    need = cfg.trainer.train_batch_size
    dropped = f" after dropping {train.num_dropped} over-long" if train.num_dropped else ""
    require(
        train.num_prompts >= need,
        "data.train_files" if cfg.data.source == "files" else "data.num_train_prompts",
        f"{train.num_prompts} training prompts{dropped}, fewer than "
        f"trainer.train_batch_size={need}",
    )
