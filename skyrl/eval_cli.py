"""``skyrl-eval``: held-out pass@1 / pass@k of a model, a run or a checkpoint, without training.

    skyrl-eval model.path=HuggingFaceTB/SmolLM2-135M-Instruct     a HF directory or id
    skyrl-eval eval.checkpoint=outputs/2026-12-01/10-00-00        a run: final_hf, else its latest checkpoint
    skyrl-eval eval.checkpoint=<run>/checkpoints/global_step_8    one checkpoint
    skyrl-eval model.path=<run>/final_adapter                     a LoRA adapter, merged into its base

The config is composed and validated exactly as for ``skyrl-train`` (same groups, same
overrides): the eval prompts are the composed ``data`` group's (files, generated tasks,
reasoning-gym), sampled with ``generator.eval_sampling`` and
``generator.eval_n_samples_per_prompt`` by the engine ``generator`` names. The rollouts
go through ``skyrl.rollouts.evaluation.evaluate_prompts``, the pass the trainer's own
eval runs, from the same seed. No training worker starts; a checkpoint's weights are
read from its files, exported with the model of the run that wrote it (``model.path`` /
``model.tokenizer_path`` of the run directory's ``resolved_config.yaml``; the command
line's where the run saved none or its own name nothing here, with a warning). The table
is printed and the results written as JSON (``eval.output_file``, default
``eval_results.json`` in the eval's run directory), with every sample beside it in a file
named after it (``a.json`` -> ``a.samples.jsonl``, the format of ``trainer.dump_rollouts``).

A run's ``final_hf`` is evaluated unless its latest checkpoint is of a later step than the
one ``final_hf`` records (a run resumed with more steps that stopped before exporting again,
or ran with ``trainer.export_hf=false``), or ``final_hf`` holds no weights file (a run killed
while exporting): then the checkpoint is, with a line saying why. A ``final_hf`` that records
no step (exported before the record existed) is evaluated.

Bad input (an output file that cannot be written, a checkpoint without weights, a data
source without eval prompts, engine actors asking for more GPUs than the local Ray has) is a
``ConfigError`` raised before any weights are read or any prompt is generated; a checkpoint
whose weights do not fit ``model.path`` (another architecture than the run trained) is one
too, found as its weights are read.
``data.source=files`` needs no ``data.train_files`` here. A sweep (``-m``) whose jobs would all
write one ``eval.output_file``, each over the last one's results, is refused before its first
job (``_shared_output_file``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import pickle
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from skyrl.config.errors import ConfigError, dir_problem, exception_line, require_dir
from skyrl.config.help import command_help, wants_help
from skyrl.config.root import SkyRLConfig
from skyrl.sweeps import writes_in_job_dir

logger = logging.getLogger(__name__)

EVAL_RUN_DIR = "hydra.run.dir=outputs/eval/${now:%Y-%m-%d}/${now:%H-%M-%S}"
"""Where an eval's Hydra run directory goes unless the command line says otherwise."""
RESULTS_FILE = "eval_results.json"
SAMPLES_SUFFIX = ".samples.jsonl"
"""The samples file is the output file's name with this in place of its suffix."""


@dataclass
class EvalResult:
    """What an eval leaves behind."""

    model: str
    """What was evaluated: the model directory or id, or the checkpoint."""
    metrics: dict[str, float]
    """``eval/pass@1``, ``eval/pass@k``, ``eval/reward_mean``, per source ``eval/<src>/...``."""
    num_prompts: dict[str, int]
    """Eval prompts per data source."""
    output_file: Path
    """The JSON file holding all of it."""
    samples_file: Path
    """Every sample: prompt and response ids and text, reward, data source."""


def evaluate(cfg: DictConfig, output_dir: str | Path) -> EvalResult:
    """Evaluate what ``cfg`` (made by ``skyrl.compose``) names (``eval.checkpoint``, else
    ``model.path``) on its eval prompts; print the table and write the JSON file (in
    ``output_dir`` unless ``eval.output_file`` says otherwise; a leading ``~`` is the home
    directory and a relative path is taken from the working directory now, as for
    ``skyrl.train``: ``EvalResult``'s paths are absolute)."""
    from skyrl.api import require_composed, require_output_dir
    from skyrl.config.preflight import check_env_and_agent
    from skyrl.config.validate import validate

    require_composed(cfg, "skyrl.evaluate")
    require_output_dir(output_dir, "skyrl.evaluate")
    typed = validate(_without_train_files_rule(cfg))
    _check_eval_prompts(typed)
    out = Path(output_dir).expanduser()
    require_dir(out, "output_dir")  # a file there (or above it): one line, not mkdir's error
    out.mkdir(parents=True, exist_ok=True)
    path = _output_file(typed.eval.output_file, out)
    samples = samples_file_for(path)
    _check_output_files(path, samples)
    check_env_and_agent(typed)
    base, ckpt, label = _model_to_evaluate(typed)
    assert base.model.tokenizer_path is not None  # local_model_paths sets it
    rows, tokenizer = _eval_rows(typed, base.model.tokenizer_path)  # before any weights are read
    _check_vocab(base, len(tokenizer))
    if typed.generator.engines_in_actors:  # Ray with room and GPUs for them, before any weights
        from skyrl.api import ray_for_engines

        ray_for_engines(typed)
    with tempfile.TemporaryDirectory(prefix="skyrl-eval-") as scratch:
        model = base if ckpt is None else _exported(base, ckpt, Path(scratch))
        metrics, num_prompts = _run_eval(model, rows, tokenizer, samples)
    result = EvalResult(label, metrics, num_prompts, path.absolute(), samples.absolute())
    _write_results(result, model)
    print(format_eval_table(result, model), flush=True)
    return result


def _check_vocab(cfg: SkyRLConfig, num_tokens: int) -> None:
    """The tokenizer has no id past the model's embedding (``check_vocab_size``, as
    ``skyrl-train``'s pre-flight checks it)."""
    from skyrl.config.preflight import check_vocab_size, model_text_config

    config = model_text_config(cfg.model.path, "model.path", cfg.model.trust_remote_code)
    check_vocab_size(cfg, num_tokens, config, None)


def samples_file_for(output_file: Path) -> Path:
    """Where the samples of the eval whose results go to ``output_file`` are written."""
    return output_file.with_name(output_file.stem + SAMPLES_SUFFIX)


def _without_train_files_rule(cfg: DictConfig) -> DictConfig:
    """``cfg``, or for ``data.source=files`` without ``data.train_files`` a copy whose
    ``train_files`` are the ``eval_files``: the data schema requires training files, which
    an eval never reads."""
    data = cfg.get("data")
    if not isinstance(data, DictConfig) or data.get("source") != "files" or data.get("train_files"):
        return cfg
    if not data.get("eval_files"):
        raise ConfigError("data.eval_files", "source=files needs at least one eval file")
    relaxed = copy.deepcopy(cfg)
    relaxed.data.train_files = relaxed.data.eval_files
    return relaxed


def _check_eval_prompts(cfg: SkyRLConfig) -> None:
    """The data source has eval prompts, and each eval file exists (a stat each)."""
    if cfg.data.source == "fake":
        raise ConfigError(
            "data.source", "fake has no prompts to evaluate on (files, arithmetic, reasoning_gym)"
        )
    from skyrl.config.preflight import check_files_exist

    check_files_exist(cfg, ("eval",))


def _output_file(configured: str | None, out: Path) -> Path:
    """``eval.output_file`` (a leading ``~`` the home directory), else ``RESULTS_FILE`` in
    ``out``. One ending in a slash names a directory, refused as an existing directory is:
    ``Path`` drops the slash, and the results went to a file of the directory's name."""
    if not configured:
        return out / RESULTS_FILE
    path = Path(configured).expanduser()
    if configured.endswith(("/", os.sep)):
        raise ConfigError(
            "eval.output_file",
            f"{configured}: names a directory (it ends in /); name a file, e.g. "
            f"{path / RESULTS_FILE}",
        )
    return path


def _check_output_files(path: Path, samples: Path) -> None:
    """The results file and its samples file can be written: neither is a directory and
    their directory exists or can be made (nothing is created here)."""
    problem = None
    if path.is_dir():
        problem = f"{path}: is a directory; name a file, e.g. {path / RESULTS_FILE}"
    elif samples.is_dir():
        problem = f"{path}: its samples file {samples} is a directory"
    else:
        in_the_way = dir_problem(path.parent)
        if in_the_way is not None:
            problem = f"{path}: {in_the_way}"
        elif any(f.exists() and not os.access(f, os.W_OK) for f in (path, samples)):
            problem = f"{path}: not writable (the file or its samples file {samples})"
    if problem:
        raise ConfigError("eval.output_file", problem)


def _model_to_evaluate(cfg: SkyRLConfig) -> tuple[SkyRLConfig, Path | None, str]:
    """``cfg`` with ``model.path`` / ``model.tokenizer_path`` resolved to local directories:
    the model to evaluate, or for a checkpoint (or a LoRA adapter directory) the base model to
    export it with; the checkpoint or adapter (None: nothing to export) and a label for what is
    evaluated. No weights are read, nothing is exported. An empty ``eval.checkpoint`` (an unset
    shell variable) is refused: it named the working directory."""
    from skyrl.config.preflight import local_model_paths
    from skyrl.models.lora import is_adapter_dir

    target = cfg.eval.checkpoint
    if target is not None and not target.strip():  # Path("") is the working directory
        raise ConfigError(
            "eval.checkpoint",
            "is empty; name a run directory or a checkpoint, or leave it unset (null) to "
            "evaluate model.path",
        )
    if target is None:
        if is_adapter_dir(cfg.model.path):
            return _adapter_base(cfg, Path(cfg.model.path).expanduser(), "model.path")
        _refuse_run_as_model(cfg.model.path)
        return local_model_paths(cfg), None, cfg.model.path
    path = Path(target).expanduser()
    if is_adapter_dir(path):
        return _adapter_base(cfg, path, "eval.checkpoint")
    final_hf = path / "final_hf"
    if (final_hf / "config.json").is_file():
        if not _holds_weights(final_hf):
            logger.warning(
                "%s holds no weights (an export cut short): evaluating the latest checkpoint",
                final_hf,
            )
        elif not _checkpoint_after_export(final_hf, path):
            return _with_model(cfg, final_hf), None, str(final_hf)
    ckpt = _checkpoint_with_weights(target, path)
    return _run_model(cfg, ckpt), ckpt, str(ckpt)


def _refuse_run_as_model(model_path: str) -> None:
    """Raise naming ``model.path`` when it is a training run or one of its checkpoints, not a
    model directory (its tokenizer failed to load, which said nothing of either)."""
    from skyrl.trainer.checkpoint import TRAINER_STATE

    path = Path(model_path).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():
        return
    if (path / TRAINER_STATE).is_file():
        what = "a checkpoint"
    elif (path / "checkpoints").is_dir() or (path / "final_hf").is_dir():
        what = "a training run"
    elif any(path.glob("global_step_*")):
        what = "a run's checkpoints directory"
    else:
        return
    raise ConfigError(
        "model.path",
        f"{model_path}: {what}, not a model directory (config.json); evaluate it with "
        f"eval.checkpoint={model_path}",
    )


def _adapter_base(cfg: SkyRLConfig, adapter: Path, key: str) -> tuple[SkyRLConfig, Path, str]:
    """For a LoRA adapter directory (a run's ``final_adapter``, named by ``key``): ``cfg`` with
    the base model its ``adapter_config.json`` names (and the adapter's tokenizer, when it holds
    one) resolved, the adapter to merge into it (``_exported``), and its label."""
    from skyrl.config.preflight import local_model_paths
    from skyrl.models.lora import ADAPTER_CONFIG, read_adapter_config

    try:
        base = read_adapter_config(adapter).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, or bad UTF-8
        problem = f"{adapter / ADAPTER_CONFIG} is not valid JSON ({exception_line(exc)})"
        raise ConfigError(key, problem) from None
    if not base:
        raise ConfigError(key, f"{adapter}: its adapter_config.json names no base model")
    tokenizer = str(adapter) if (adapter / "tokenizer_config.json").is_file() else None
    model = dataclasses.replace(cfg.model, path=str(base), tokenizer_path=tokenizer)
    try:
        resolved = local_model_paths(dataclasses.replace(cfg, model=model))
    except ConfigError as exc:
        what = "its base model" if exc.key == "model.path" else "its tokenizer"
        problem = f"{adapter}: {what}: {exc.message}"
        raise ConfigError(key, problem) from None
    return resolved, adapter, str(adapter)


def _holds_weights(model_dir: Path) -> bool:
    """Whether a ``from_pretrained`` directory has a weights file (a run killed while
    exporting leaves ``final_hf`` with its config and none)."""
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("pytorch_model*.bin"))


def _checkpoint_after_export(final_hf: Path, run: Path) -> bool:
    """Whether the run's latest checkpoint is of a later step than its export ``final_hf``
    records (``EXPORT_RECORD``); logged when it is. False for an export that records no
    step, and for a run without a readable latest checkpoint (``final_hf`` is evaluated)."""
    from skyrl.trainer.checkpoint import exported_step, find_checkpoint, read_trainer_state

    exported = exported_step(final_hf)
    if exported is None:
        return False
    try:
        ckpt = find_checkpoint(run)
        latest = read_trainer_state(ckpt).get("step") if ckpt is not None else None
    except (OSError, ValueError):  # a half-written checkpoint: the export is complete
        return False
    if ckpt is None or not isinstance(latest, int) or latest <= exported:
        return False
    logger.warning(
        "%s is from step %d, %s is step %d (%s): evaluating the latest checkpoint",
        final_hf,
        exported,
        ckpt.parent / "latest",
        latest,
        ckpt.name,
    )
    return True


def _exported(base: SkyRLConfig, ckpt: Path, scratch: Path) -> SkyRLConfig:
    """``base`` with its model the checkpoint ``ckpt`` (or the LoRA adapter directory, merged),
    exported into ``scratch`` with the base model's config and tokenizer
    (``_model_to_evaluate``'s local paths)."""
    from skyrl.models.lora import is_adapter_dir, merge_adapter_dir
    from skyrl.trainer.checkpoint import WeightsMismatchError, export_checkpoint_hf

    assert base.model.tokenizer_path is not None  # local_model_paths sets it
    # what named ckpt: an adapter directory may be model.path itself
    key = "eval.checkpoint" if base.eval.checkpoint else "model.path"
    remote = {"trust_remote_code": base.model.trust_remote_code}
    try:
        if is_adapter_dir(ckpt):  # a LoRA run's final_adapter is merged into its base model
            hf_dir = merge_adapter_dir(
                ckpt, base.model.path, base.model.tokenizer_path, scratch, **remote, key=key
            )
        else:  # a checkpoint, exported with the base model's config
            hf_dir = export_checkpoint_hf(
                ckpt, base.model.path, base.model.tokenizer_path, scratch, **remote
            )
    except WeightsMismatchError as exc:  # model.path names another architecture
        problem = f"{exc}; model.path must name the model the run trained"
    except (EOFError, pickle.UnpicklingError, RuntimeError) as exc:
        if not _is_damaged_weights(exc):
            raise
        where = ckpt if is_adapter_dir(ckpt) else ckpt / "policy" / "state"
        problem = (
            f"{ckpt}: its weights in {where} cannot be read "
            f"({exception_line(exc)}): a file cut short (a run killed while saving, a "
            "partial copy); evaluate another checkpoint"
        )
    else:
        return _with_model(base, hf_dir)
    raise ConfigError(key, problem)  # outside the handler: no context


def _is_damaged_weights(exc: BaseException) -> bool:
    """Whether ``torch.load`` failed on a file cut short: an empty or torn pickle, or a torn
    zip archive (PyTorch's ``RuntimeError`` from its zip reader)."""
    if isinstance(exc, (EOFError, pickle.UnpicklingError)):
        return True
    return "PytorchStreamReader failed" in str(exc)


def _checkpoint_with_weights(target: str, path: Path) -> Path:
    """The checkpoint ``eval.checkpoint`` (``target``, at ``path``) names, its policy weights
    on disk (the files ``policy_state_dict`` reads; checked, not read)."""
    from skyrl.trainer.checkpoint import TRAINER_STATE, find_checkpoint

    problem = f"{target}: neither a run directory (with final_hf or checkpoints/) nor a checkpoint"
    try:
        ckpt = find_checkpoint(path) if path.is_dir() else None
    except ValueError as exc:  # its ``latest`` names a missing or half-written checkpoint
        ckpt, problem = None, f"{target}: {exc} (no {TRAINER_STATE})"
    if ckpt is None and (path / "final_hf" / "config.json").is_file():  # without weights
        problem = (
            f"{target}: its final_hf holds no weights (an export cut short) and it has no "
            "checkpoint"
        )
    if ckpt is None and (path / "config.json").is_file():  # a run's final_hf, a HF model
        problem = (
            f"{target}: a model directory (config.json), not a run or a checkpoint; evaluate "
            f"it with model.path={target}"
        )
    if ckpt is None:
        raise ConfigError("eval.checkpoint", problem)  # outside the handler: no context
    state = ckpt / "policy" / "state"
    if (state / "mp_rank_00_model_states.pt").is_file():  # ZeRO 0-2: every weight
        return ckpt
    if not any(state.glob("*_model_states.pt")):
        raise ConfigError("eval.checkpoint", f"{target}: no policy weights in {state}")
    if not any(state.glob("*_optim_states.pt")):  # ZeRO-3's fp32 weights are in these
        raise ConfigError(
            "eval.checkpoint",
            f"{target}: {state} holds ZeRO-3 partitions without their *_optim_states.pt",
        )
    return ckpt


def _run_model(cfg: SkyRLConfig, ckpt: Path) -> SkyRLConfig:
    """``cfg`` with the local model paths of the run that wrote ``ckpt`` (its architecture and
    tokenizer), from the run directory's ``resolved_config.yaml``. The command line's
    ``model.path`` / ``model.tokenizer_path`` stand in when the run saved none, or when its
    own name nothing here any more (a model moved, a run from another machine; a warning
    says so): a checkpoint that does not fit them is refused as it is exported."""
    from skyrl.config.preflight import local_model_paths

    saved = ckpt.parent.parent / "resolved_config.yaml"
    saved_cfg = OmegaConf.load(saved) if saved.is_file() else None
    model = (saved_cfg.get("model") if isinstance(saved_cfg, DictConfig) else None) or {}
    path, tokenizer_path = model.get("path"), model.get("tokenizer_path")
    if not path:
        return local_model_paths(cfg)
    run_model = dataclasses.replace(
        cfg.model, path=str(path), tokenizer_path=tokenizer_path and str(tokenizer_path)
    )
    try:
        return local_model_paths(dataclasses.replace(cfg, model=run_model))
    except ConfigError as exc:  # the run's model (or tokenizer) names nothing here
        gone = exc
    logger.warning(
        "%s names %s=%r, which does not resolve here (%s); evaluating with model.path=%s "
        "from the command line",
        saved,
        gone.key,
        getattr(run_model, gone.key.split(".")[-1]),
        gone.message,
        cfg.model.path,
    )
    return local_model_paths(cfg)


def _with_model(cfg: SkyRLConfig, model_dir: Path) -> SkyRLConfig:
    model = dataclasses.replace(cfg.model, path=str(model_dir), tokenizer_path=str(model_dir))
    return dataclasses.replace(cfg, model=model)


def _eval_rows(cfg: SkyRLConfig, tokenizer_path: str) -> tuple[list, Any]:
    """The eval prompts (``data.overlong_prompts`` applied) and the tokenizer in
    ``tokenizer_path`` (of the weights to evaluate), refused when there are none. No
    weights are read."""
    from skyrl.config.preflight import load_tokenizer
    from skyrl.data import load_checked_prompts

    tokenizer = load_tokenizer(cfg, tokenizer_path)
    rows = load_checked_prompts(cfg, "eval", tokenizer)
    if not rows:
        raise ConfigError(
            "data.num_eval_prompts" if cfg.data.source != "files" else "data.eval_files",
            "no eval prompts to evaluate on",
        )
    return rows, tokenizer


def _run_eval(
    cfg: SkyRLConfig, rows: list, tokenizer: Any, samples_file: Path
) -> tuple[dict[str, float], dict[str, int]]:
    """The eval pass over ``rows`` on the engines ``generator`` names (in Ray actors: on the Ray
    ``evaluate`` started for them), its samples written to ``samples_file``; the metrics and
    the prompts per source."""
    from collections import Counter

    from skyrl.generators import VersionClock, make_generator
    from skyrl.inference.factory import make_engine
    from skyrl.rollouts.evaluation import evaluate_prompts
    from skyrl.rollouts.sync import dump_rollouts, eval_seed

    g = cfg.generator
    engine = make_engine(
        g,
        cfg.model.path,
        cfg.model.tokenizer_path,
        trust_remote_code=cfg.model.trust_remote_code,
    )
    try:
        generator = make_generator(g, cfg.environment, engine, tokenizer, VersionClock())
        metrics, output = evaluate_prompts(generator, rows, g, eval_seed(cfg))
    finally:
        engine.shutdown()
    dump_rollouts(output, tokenizer, samples_file)
    return metrics, dict(sorted(Counter(r.data_source for r in rows).items()))


def _write_results(result: EvalResult, cfg: SkyRLConfig) -> None:
    from skyrl.rollouts.sync import eval_seed

    g = cfg.generator
    record = {
        "model": result.model,
        "data_source": cfg.data.source,
        "num_prompts": result.num_prompts,
        "samples_per_prompt": g.eval_n_samples_per_prompt,
        "sampling": {**dataclasses.asdict(g.eval_sampling), "seed": eval_seed(cfg)},
        "max_generate_length": g.max_generate_length,
        "metrics": result.metrics,
        "samples_file": str(result.samples_file),
    }
    result.output_file.parent.mkdir(parents=True, exist_ok=True)
    result.output_file.write_text(json.dumps(record, indent=2) + "\n")


def format_eval_table(result: EvalResult, cfg: SkyRLConfig) -> str:
    """One row per data source and one for all (``all``; ``(all)`` beside a source named
    ``all``): prompts, samples, pass@1, pass@k, reward, and the samples whose env (or agent)
    failed when there are any (``eval/env_errors``: counted over all sources, so in the
    ``all`` row, or the one source's)."""
    from skyrl.tracking.metric_names import EVAL_ENV_ERRORS

    k = cfg.generator.eval_n_samples_per_prompt
    m = result.metrics
    columns = ["pass@1"] + ([f"pass@{k}"] if k > 1 else []) + ["reward_mean"]
    env_errors = m.get(EVAL_ENV_ERRORS, 0.0)
    overall = "(all)" if "all" in result.num_prompts else "all"  # a source may be named all
    width = max(len("source"), *(len(s) for s in result.num_prompts), len(overall))
    header = f"{'source':<{width}}  {'prompts':>7}  {'samples':>7}" + "".join(
        f"  {c:>11}" for c in columns
    )
    if env_errors:
        header += f"  {'env_errors':>11}"
    lines = [
        f"eval of {result.model}: {k} sample(s) per prompt at temperature "
        f"{cfg.generator.eval_sampling.temperature:g}",
        header,
    ]
    sources = [(s, f"eval/{s}", n) for s, n in result.num_prompts.items()]
    if len(sources) > 1:
        sources.append((overall, "eval", sum(result.num_prompts.values())))
    for i, (name, prefix, n) in enumerate(sources):
        values = "".join(f"  {m.get(f'{prefix}/{c}', float('nan')):>11.3f}" for c in columns)
        if env_errors and i == len(sources) - 1:  # the all row, or the one source's
            values += f"  {env_errors:>11.0f}"
        lines.append(f"{name:<{width}}  {n:>7}  {n * k:>7}{values}")
    lines.append(f"results: {result.output_file}")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
@writes_in_job_dir
def _hydra_main(cfg: DictConfig) -> float:
    """One eval, ended by a problem with one line and an exit code; a sweep job fails with
    both instead, as ``skyrl-train``'s (recorded in the sweep summary). Returns the eval's
    ``eval/pass@1``, as ``skyrl-train`` returns its final one: the objective of a search
    sweeper (``hydra/sweeper=skyrl_optuna``, e.g. over ``generator.eval_sampling``), which
    fails a trial that returns none. It writes in the Hydra job dir whatever
    ``trainer.output_dir`` says (``writes_in_job_dir``: the sweep summary reads it there)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from skyrl.cli import EXIT_CONFIG_ERROR, EXIT_RUN_FAILED, fail_job
    from skyrl.config.cli_errors import one_line_error
    from skyrl.generators.agent_loop import EnvHangError
    from skyrl.inference.client import EngineDiedError
    from skyrl.tracking.metric_names import EVAL_PASS_AT_1

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        return evaluate(cfg, HydraConfig.get().runtime.output_dir).metrics[EVAL_PASS_AT_1]
    except ConfigError as exc:
        fail_job(one_line_error(exc), EXIT_CONFIG_ERROR, multirun, exc)
    except (EngineDiedError, EnvHangError) as exc:
        fail_job(f"error: {exc}", EXIT_RUN_FAILED, multirun, exc)


def _check_command_line() -> None:
    """Compose and validate ``sys.argv`` once, as ``skyrl-train`` does (one line, exit 2; its
    Hydra flags too), except that ``data.source=files`` needs no training files (a command
    line failing only on that rule is checked again with ``data.train_files`` set to the eval
    files), and a sweep's jobs may share ``trainer.output_dir`` (checked unset)."""
    from skyrl.api import config_error_line
    from skyrl.cli import EXIT_CONFIG_ERROR, hydra_flags_problem, package_problem, with_config_dir
    from skyrl.config import register_configs
    from skyrl.config.precheck import command_line_problem

    register_configs()
    flags = hydra_flags_problem(sys.argv[1:])
    if flags is not None:
        print(flags, file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    # skyrl-eval writes in its Hydra run (job) dir whatever trainer.output_dir says: jobs
    # sharing one (an experiment's run dir) are not two trainers writing in one directory
    argv = with_override(with_config_dir(sys.argv[1:]), "trainer.output_dir=null")
    problem = command_line_problem(argv, preflight_jobs=False)  # a training run's checks
    if _is_train_files_rule(problem):
        with_files = with_override(argv, "data.train_files=${data.eval_files}")
        problem = command_line_problem(with_files, preflight_jobs=False)
        if _is_train_files_rule(problem):  # no eval files either
            problem = ConfigError("data.eval_files", "source=files needs at least one eval file")
    if problem is None:
        problem = _shared_output_file(argv)
    line = package_problem(sys.argv[1:]) if problem is None else config_error_line(problem)
    if line is not None:
        print(line, file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


def _shared_output_file(argv: list[str]) -> ConfigError | None:
    """For a sweep of several jobs (a swept override, or a search sweeper), one
    ``eval.output_file`` for all of them: each job's results and samples would replace the last
    one's, every job printing the file as its own. A swept value or one with an interpolation
    (``${hydra:job.num}``) is taken as per job."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = get_args_parser().parse_known_args(argv)[0]
    if not args.multirun:
        return None
    overrides = OverridesParser.create().parse_overrides(list(args.overrides))
    if not any(o.is_sweep_override() or o.key_or_group == "hydra/sweeper" for o in overrides):
        return None  # one job
    fixed = [o.value() for o in overrides if o.key_or_group == "eval.output_file"]
    if not fixed or not isinstance(fixed[-1], str) or "${" in fixed[-1]:
        return None  # unset (null), swept, or per job
    path = Path(fixed[-1])
    per_job = path.with_name(f"{path.stem}_${{hydra:job.num}}{path.suffix}")
    return ConfigError(
        "eval.output_file",
        f"{path}: every job of the sweep writes its results there (and its samples to "
        f"{samples_file_for(path)}), each over the last one's; leave it unset (each job's own "
        f"directory) or make it per job, e.g. eval.output_file={per_job}",
    )


def _is_train_files_rule(problem: Exception | None) -> bool:
    """Whether ``problem`` is the data schema's "source=files needs a training file" rule."""
    from skyrl.config.data import NO_TRAIN_FILES

    return (
        isinstance(problem, ConfigError)
        and problem.key == "data.train_files"
        and problem.message == NO_TRAIN_FILES
    )


def with_eval_run_dir(argv: list[str]) -> list[str]:
    """``argv`` (the arguments after the command) with ``EVAL_RUN_DIR`` among its overrides,
    unless it names a run directory or sweeps (a sweep's jobs go under
    ``hydra.sweep.dir``, as ``skyrl-train``'s). Hydra's parser takes one unbroken run of
    overrides, so it goes right after them: before a leading flag (``-m``, ``--cfg job``) it
    made the overrides after the flag unrecognized arguments (exit 2). Without overrides it
    goes first, where no flag can take it as its value (``--info`` takes one)."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(argv)
    if args.multirun or any(a.startswith(("hydra.run.dir=", "hydra/")) for a in argv):
        return list(argv)
    return with_override(argv, EVAL_RUN_DIR)


def with_override(argv: list[str], override: str) -> list[str]:
    """``argv`` with ``override`` right after its overrides (Hydra's parser takes one unbroken
    run of them: after a trailing flag, ``-m`` or ``--cfg job``, it is an unrecognized
    argument), or first when it has none (where no flag can take it as its value)."""
    from hydra._internal.utils import get_args_parser

    overrides, end = list(get_args_parser().parse_known_args(argv)[0].overrides), 0
    if overrides:  # one unbroken run of ``argv``
        k = len(overrides)
        end = next((i + k for i in range(len(argv)) if argv[i : i + k] == overrides), len(argv))
    return [*argv[:end], override, *argv[end:]]


EVAL_SUMMARY = (
    "Held-out pass@1 / pass@k of a model, a training run or one checkpoint, without training: "
    "the eval prompts of the composed data group, sampled with generator.eval_sampling by the "
    "engine the generator group names. Prints a table and writes eval.output_file (JSON) with "
    "every sample beside it."
)
EVAL_EXAMPLES = (
    ("skyrl-eval model.path=HuggingFaceTB/SmolLM2-135M-Instruct", "a HF directory or id"),
    ("skyrl-eval eval.checkpoint=<run dir>", "a run: final_hf, else its latest checkpoint"),
    ("skyrl-eval eval.checkpoint=<run dir>/checkpoints/global_step_8", "one checkpoint"),
    ("skyrl-eval model.path=skyrl-tiny generator=hf", "the tiny model, transformers engine"),
)


NOT_WRITTEN = "the eval in progress wrote no results"
INTERRUPTED = f"interrupted: {NOT_WRITTEN}"


def main() -> None:
    """Console script: check the command line (as ``skyrl-train`` does), then evaluate (each
    job of a sweep, ``-m``, as ``skyrl-train`` runs them). Ctrl-C and SIGTERM end it with one
    line and exit code 130 or 143, as ``skyrl-train``'s (the engine is shut down in
    ``_run_eval``'s ``finally``); Ctrl-C was a traceback through the engine's serving loop,
    exit 1, and SIGTERM killed it without a line (with engines in Ray actors: Ray's stack
    banner, SIGABRT, and Ray's agents outlived it)."""
    import threading

    from hydra._internal.utils import get_args_parser

    from skyrl.cli import (
        _exit_now,
        _raise_interrupted,
        _signal_of,
        _stopped_by,
        _terminated,
        run_sweep,
    )

    if wants_help(sys.argv[1:]):
        print(command_help("skyrl-eval", EVAL_SUMMARY, EVAL_EXAMPLES, sys.argv[1:]))
        return
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if in_main_thread else None
    try:
        _check_command_line()
        sys.argv[1:] = with_eval_run_dir(sys.argv[1:])
        if get_args_parser().parse_known_args(sys.argv[1:])[0].multirun:
            run_sweep(_hydra_main)
        else:
            _hydra_main()
    except KeyboardInterrupt as exc:
        signum = _signal_of(exc)
        print(f"{_stopped_by(signum)}: {NOT_WRITTEN}", file=sys.stderr)
        _exit_now(128 + signum)
    finally:
        _terminated.clear()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
