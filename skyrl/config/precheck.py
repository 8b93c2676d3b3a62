"""Compose and validate the command line's config once, before Hydra's main runs.

Hydra reports composition errors as several lines plus a hint about
HYDRA_FULL_ERROR; we want one line naming the key. A multirun is checked before any
job starts, so a bad job 5 is reported before job 1 trains:

* each swept value alone, against the fixed overrides (the plainest message for a bad value);
* then every job together: the cartesian product the basic sweeper launches, numbered as
  Hydra numbers them, so a combination that fails (batch 12 with mini-batch 8) is reported
  with its job number and overrides. Composing a config costs 0.1-0.3 s, so past
  ``MAX_SWEEP_JOBS_CHECKED`` jobs only the values alone are checked, with a warning saying so;
* a search sweeper (Optuna) samples its space instead: choice and range values are
  enumerated and an interval is checked at its two bounds (the values between are not), and
  since Optuna optimizes what each trial returns (the final eval/pass@1), a config that
  never evaluates is refused.

The search space includes ``hydra.sweeper.params`` (the ``skyrl_optuna`` preset's), read from
the Hydra config composed from the fixed overrides, as Hydra composes it before sweeping.
Other ``hydra.*`` overrides configure Hydra, not the jobs, and are not composed into them.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override
from omegaconf import DictConfig, OmegaConf

from skyrl.config.cli_errors import one_line_error
from skyrl.config.errors import ConfigError, require_dir
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import validate

CONFIG_MODULE = "skyrl.conf"
CONFIG_NAME = "config"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
MAX_SWEEP_JOBS_CHECKED = 128
"""Most jobs (or search-space points) composed one by one; about 30 s on a busy 2-core box."""


class SweepJobError(ConfigError):
    """A sweep job that fails although each of its values passes alone: the job's own error
    line, then which job it is (``; in sweep job 3 of 4: a=12 b=8``)."""

    def __init__(self, cause: BaseException, job: str):
        key, _, message = one_line_error(cause).removeprefix("error: ").partition(": ")
        super().__init__(key, f"{message}; in {job}" if message else f"in {job}")


def precheck_command_line(argv: list[str]) -> str | None:
    """The one-line error for ``argv``, or None when it composes and validates."""
    problem = command_line_problem(argv)
    return None if problem is None else one_line_error(problem)


def command_line_problem(argv: list[str]) -> Exception | None:
    """What composing and validating ``argv`` raised, or None when it is fine.

    ``cli_errors.is_bad_input`` tells bad input from a bug in skyrl."""
    args, _ = get_args_parser().parse_known_args(argv)
    if (
        args.help
        or args.hydra_help
        or args.info
        or args.shell_completion
        or args.config_path
        or args.config_dir
    ):
        return None  # nothing to compose, or a config tree we do not own
    config_name = args.config_name or CONFIG_NAME
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            if args.multirun:
                _check_sweep(config_name, args.overrides)
            else:
                validate(compose(config_name=config_name, overrides=_run_overrides(args.overrides)))
                _check_hydra_dir(config_name, args.overrides, "run")
    except Exception as exc:  # bad input and bugs alike; the caller formats and tells them apart
        return exc
    return None


def needs_objective(sweeper_target: str) -> bool:
    """Whether the sweeper optimizes the value each job returns (Optuna's does)."""
    return "optuna" in sweeper_target


def _run_overrides(overrides: list[str]) -> list[str]:
    """A single run's overrides to compose: Hydra's own (``hydra.*``) left out."""
    parsed = OverridesParser.create().parse_overrides(overrides)  # one per line, in order
    pairs = list(zip(overrides, parsed, strict=True))
    plain = [line for line, o in pairs if not o.is_sweep_override() and not o.is_hydra_override()]
    return plain + [line for line, o in pairs if o.is_sweep_override()]  # Hydra refuses these


def _check_sweep(config_name: str, overrides: list[str]) -> None:
    """Raise for the first swept value, job or search-space point that fails (module doc)."""
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    parsed = parser.parse_overrides(overrides)
    for o in parsed:
        if o.is_hydra_override() and o.is_sweep_override():  # Hydra refuses it, in 3 lines
            raise ConfigError(o.key_or_group, _hydra_sweep_message(o))
    fixed = [line for line, o in zip(overrides, parsed, strict=True) if not o.is_sweep_override()]
    hydra_cfg = compose(config_name=config_name, overrides=fixed, return_hydra_config=True).hydra
    _require_static_dir(hydra_cfg, "sweep")
    target = str(OmegaConf.select(hydra_cfg, "sweeper._target_", default=""))
    params = OmegaConf.select(hydra_cfg, "sweeper.params", default=None) or {}
    lines = [f"{k}={v}" for k, v in params.items()] + overrides  # a later line wins, as in Hydra
    basic = target == BASIC_SWEEPER
    axes = _axes(parser.parse_overrides(lines), basic)
    search = hydra_cfg.sweeper if needs_objective(target) else None
    for job in _values_alone(axes):
        _check_job(config_name, job, search)
    count = math.prod(len(axis) for axis in axes)
    if sum(len(axis) > 1 for axis in axes) <= 1:
        return  # the values alone were the jobs
    if count > MAX_SWEEP_JOBS_CHECKED:
        what = "jobs" if basic else "search-space points"
        print(
            f"warning: the sweep has {count} {what}, more than the {MAX_SWEEP_JOBS_CHECKED} the "
            "precheck composes one by one: each swept value was checked alone, not every "
            "combination",
            file=sys.stderr,
        )
        return
    for number, point in enumerate(itertools.product(*axes)):
        try:
            _check_job(config_name, list(point), search)
        except Exception as exc:
            label = _job_label(point, axes, number, count, basic)
            raise SweepJobError(exc, label) from exc


def _axes(parsed: list[Override], basic: bool) -> list[list[str]]:
    """One list of override lines per key, in Hydra's order: a fixed key's one line, a swept
    key's values (a search sweeper's interval: its two bounds). Optuna samples a range up to
    and including its stop; only the values Hydra lists are checked."""
    axes: dict[str, list[str]] = {}
    for o in parsed:
        if o.is_hydra_override():
            continue
        key = o.get_key_element()
        if not o.is_sweep_override():
            axes[key] = [o.input_line or f"{key}={o.value()}"]
        elif o.is_discrete_sweep():
            axes[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        elif o.is_interval_sweep() and not basic:
            interval = o.value()
            assert isinstance(interval, IntervalSweep)  # is_interval_sweep
            axes[key] = [f"{key}={interval.start}", f"{key}={interval.end}"]
        else:
            raise ConfigError(
                o.key_or_group,
                f"{_value_text(o)} is a search space; the basic sweeper only enumerates choice "
                "and range sweeps (use a search sweeper: hydra/sweeper=skyrl_optuna)",
            )
    return list(axes.values())


def _job_label(job: tuple[str, ...], axes: list[list[str]], number: int, count: int,
               basic: bool) -> str:  # fmt: skip
    """``sweep job 3 of 4: a=12 b=8`` (Hydra's job number), or a search-space point."""
    swept = " ".join(line for line, axis in zip(job, axes, strict=True) if len(axis) > 1)
    return f"sweep job {number} of {count}: {swept}" if basic else f"search-space point {swept}"


def _values_alone(axes: list[list[str]]) -> Iterator[list[str]]:
    """The fixed lines plus one swept value, for every value of every swept key; the fixed
    lines alone when nothing is swept."""
    swept = [i for i, axis in enumerate(axes) if len(axis) > 1]
    fixed = {i: axis[0] for i, axis in enumerate(axes) if len(axis) == 1}
    if not swept:
        yield list(fixed.values())
    for i in swept:
        for line in axes[i]:
            yield [line if j == i else fixed[j] for j in range(len(axes)) if j in fixed or j == i]


def _check_hydra_dir(config_name: str, overrides: list[str], which: str) -> None:
    """Hydra makes ``hydra.<which>.dir`` before the job starts: refuse one it cannot make."""
    hydra_cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    _require_static_dir(hydra_cfg.hydra, which)


def _require_static_dir(hydra_cfg: DictConfig, which: str) -> None:
    """The part of ``hydra.<which>.dir`` before its first interpolation (``${now:...}`` is
    resolved only when Hydra runs) can be a directory: no file in the way, writable."""
    section = OmegaConf.to_container(hydra_cfg[which], resolve=False)
    assert isinstance(section, dict)  # hydra.run / hydra.sweep are mappings
    raw = str(section["dir"])
    static, interpolated, _ = raw.partition("${")
    folder = Path(static)
    if interpolated and not static.endswith("/"):  # outputs/run_${now:...}: outputs is made
        folder = folder.parent
    require_dir(folder, f"hydra.{which}.dir")


def _check_job(config_name: str, overrides: list[str], search: DictConfig | None) -> None:
    """Compose and validate one job's config; under a ``search`` sweeper (its config), the job
    must return an objective, and a dry run must not write into a persistent study."""
    typed = validate(compose(config_name=config_name, overrides=overrides))
    if search is None:
        return
    _require_eval(typed)
    if typed.trainer.dry_run and search.get("storage"):
        raise ConfigError(
            "hydra.sweeper.storage",
            "a dry run tells the study a placeholder objective for each trial, which this "
            "storage would keep; dry-run without it (hydra.sweeper.storage=null)",
        )


def _require_eval(cfg: SkyRLConfig) -> None:
    """Raise unless a run of ``cfg`` ends with an eval/pass@1 (the sweep objective)."""
    d = cfg.data
    why = "so no trial has the sweep objective (the final eval/pass@1)"
    if d.source == "fake":
        raise ConfigError("data.source", f"fake rollouts are never evaluated, {why}")
    if d.source == "files" and not d.eval_files:
        raise ConfigError("data.eval_files", f"no held-out files, {why}; list some")
    if d.source != "files" and d.num_eval_prompts == 0:
        raise ConfigError("data.num_eval_prompts", f"is 0, {why}; set it > 0")


def _hydra_sweep_message(o: Override) -> str:
    """Why a sweep over a ``hydra.*`` key is refused, and what to write instead."""
    message = f"Hydra's own config cannot be swept (got {_value_text(o)!r})"
    searched = o.key_or_group.removeprefix("hydra.sweeper.params.")
    if searched != o.key_or_group:
        message += f"; put a search space on the key itself, e.g. {searched}={_value_text(o)}"
    return message


def _value_text(o: Override) -> str:
    """The value as the user wrote it (``interval(1e-5,1e-3)``)."""
    return (o.input_line or "").partition("=")[2]
