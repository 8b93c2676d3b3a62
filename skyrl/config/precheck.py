"""Compose and validate the command line's config once, before Hydra's main runs.

Hydra reports composition errors as several lines plus a hint about
HYDRA_FULL_ERROR; we want one line naming the key. A multirun is checked before any
job starts, so a bad job 5 is reported before job 1 trains:

* the sweep dir must not hold an earlier sweep's job dirs (their rows would join the
  summary, and job N would resume the checkpoints of the earlier job N), except a dry
  run's (``trainer.dry_run=true``: no checkpoints, nothing trained) that a job of this
  sweep takes over (its own dir: Hydra rewrites it), so a sweep dry-run first then runs;
* every job: the cartesian product the basic sweeper launches, numbered as Hydra numbers
  them; the sweep is refused only when a job fails, reported with its job number and
  overrides (batch 12 with mini-batch 8: ``; in sweep job 3 of 4: ...``). Each swept value
  is also composed alone, against the other swept keys' defaults: a value that fails alone
  AND in every job that takes it, with the same error, keeps that plain message (``abc``
  is not an integer); one that fails alone but not in its jobs is fine. Composing a config
  costs 0.1-0.3 s, so past ``MAX_SWEEP_JOBS_CHECKED`` jobs only the values alone, the first
  job taking each value that failed alone, and jobs 0 and 1 are checked, with a warning;
* every job checked also passes what its run checks at its start (``skyrl.train``): its run
  dir, then the pre-flight as a dry run (data rows, prompts counted against
  ``trainer.train_batch_size``, prompt lengths, model paths, env): a job that would fail
  there is refused, with its number and overrides, before job 0 trains (before, job 1's
  too few training prompts were found once job 0 had trained). This costs a dry run's
  pre-flight a job (about 1 s for the main job's 544 prompts on 2 cores, 0.01 s for the
  smoke experiment's 12); ``skyrl-eval`` sweeps skip it (an eval reads no training prompts);
* no two jobs write to one directory (a fixed ``trainer.output_dir``, a fixed
  ``hydra.sweep.subdir``): the later job would resume the earlier one's last checkpoint;
* a search sweeper (Optuna) samples its space instead: choice and range values are
  enumerated and an interval is checked at its two bounds (the values between are not), and
  since Optuna optimizes what each trial returns (the final eval/pass@1), a config that
  never evaluates is refused. Trials may sample one point twice, so their output dir must
  name the trial (``${hydra:job.num}``), unless there is one trial.

Each job is composed as Hydra hands it to the job (its number set, Hydra's config current),
so ``${hydra:job.num}`` and the like resolve as they will in the job. The search space
includes ``hydra.sweeper.params`` (the ``skyrl_optuna`` preset's), read from the Hydra config
composed from the fixed overrides, as Hydra composes it before sweeping. Other ``hydra.*``
overrides configure Hydra (its dirs), not the jobs' own config.
"""

from __future__ import annotations

import copy
import io
import math
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import NamedTuple

from hydra import compose, initialize_config_module
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from skyrl.config.cli_errors import one_line_error
from skyrl.config.errors import ConfigError, require, require_dir
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import validate

CONFIG_MODULE = "skyrl.conf"
CONFIG_NAME = "config"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
MAX_SWEEP_JOBS_CHECKED = 128
"""Most jobs (or search-space points) composed one by one; about 30 s on a busy 2-core box."""
ADDED_GROUP = re.compile(r"Multiple values for (\S+)\. To override a value use 'override \1: .+'")
"""Hydra's refusal of a group added that the defaults list holds already, with a defaults
list's advice (``override group: option``, YAML)."""


class SweepJobError(ConfigError):
    """A sweep job that fails, unless for a value that fails alone and in every job that takes
    it: the job's own error line, then which job it is (``; in sweep job 3 of 4: a=12 b=8``)."""

    def __init__(self, cause: BaseException, job: str):
        key, _, message = one_line_error(cause).removeprefix("error: ").partition(": ")
        super().__init__(key, f"{message}; in {job}" if message else f"in {job}")


def precheck_command_line(argv: list[str]) -> str | None:
    """The one-line error for ``argv``, or None when it composes and validates."""
    problem = command_line_problem(argv)
    return None if problem is None else one_line_error(problem)


def command_line_problem(argv: list[str], preflight_jobs: bool = True) -> Exception | None:
    """What composing and validating ``argv`` raised, or None when it is fine.
    ``preflight_jobs``: a sweep's jobs pass ``skyrl.train``'s start-of-run checks too (module
    doc; ``skyrl-eval`` turns it off).

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
            check_group_values(args.overrides)
            if args.multirun:
                _check_sweep(config_name, args.overrides, preflight_jobs)
            else:  # composed here: Hydra's own errors are bad input (``is_bad_input``)
                overrides = _run_overrides(args.overrides)
                composed = compose(config_name, overrides, return_hydra_config=True)
                _check_job(composed, None, None)
                _require_static_dir(composed.hydra, "run")
    except Exception as exc:  # bad input and bugs alike; the caller formats and tells them apart
        return _command_line_advice(exc, args.overrides)
    return None


def check_group_values(lines: list[str]) -> None:
    """Raise a ``ConfigError`` naming the first config group set to something that names no
    option (``experiment=null``, ``{"algorithm": 3}``): Hydra's ``ValueError`` for it names
    no key. Needs an initialized Hydra (it knows the groups): ``skyrl.compose``'s, or the
    command line's."""
    loader = GlobalHydra.instance().config_loader()
    for override in OverridesParser.create().parse_overrides(lines):
        value, group = override.value(), override.key_or_group
        if override.is_sweep_override() or override.is_delete():
            continue  # a sweep's values are checked job by job
        if isinstance(value, (str, list, dict)):
            continue  # an option, several, or a mapping merged into the group's node
        parent, _, name = group.rpartition("/")
        if name in loader.list_groups(parent):
            options = ", ".join(
                o for o in loader.get_group_options(group) if not o.endswith("_schema")
            )
            got = "None" if value is None else f"the {type(value).__name__} {value!r}"
            raise ConfigError(
                group,
                f"is a config group: its value names one of its options ({options}); got {got}",
            )


def _command_line_advice(exc: Exception, overrides: list[str]) -> Exception:
    """``exc``, or for Hydra's refusal of the override ``+group=option`` whose group the
    defaults list holds already (its advice is a defaults list's YAML, ``override group:
    option``) the command line's own: the override without its ``+``."""
    found = ADDED_GROUP.fullmatch(str(exc).strip())
    if not isinstance(exc, ConfigCompositionException) or found is None:
        return exc
    line = next((o for o in overrides if o.startswith(f"+{found.group(1)}=")), None)
    if line is None:  # a defaults list's own (a user's experiment YAML): the advice fits
        return exc
    group = found.group(1)
    message = f"{group} is in the defaults already: choose it with {line[1:]} (no +)"
    advice = ConfigError(line, message)
    advice.__cause__ = exc
    return advice


def needs_objective(sweeper_target: str) -> bool:
    """Whether the sweeper optimizes the value each job returns (Optuna's does)."""
    return "optuna" in sweeper_target


def _run_overrides(overrides: list[str]) -> list[str]:
    """A single run's overrides to compose: its sweep overrides last (Hydra refuses them)."""
    parsed = OverridesParser.create().parse_overrides(overrides)  # one per line, in order
    pairs = list(zip(overrides, parsed, strict=True))
    fixed = [line for line, o in pairs if not o.is_sweep_override()]
    return fixed + [line for line, o in pairs if o.is_sweep_override()]


def _check_sweep(config_name: str, overrides: list[str], preflight_jobs: bool) -> None:
    """Raise for a sweep dir holding earlier jobs, the first job or search-space point that
    fails (``preflight_jobs``: its start-of-run checks too), or two jobs writing to one
    directory (module doc)."""
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    parsed = parser.parse_overrides(overrides)
    for o in parsed:
        if o.is_hydra_override() and o.is_sweep_override():  # Hydra refuses it, in 3 lines
            raise ConfigError(o.key_or_group, _hydra_sweep_message(o))
    pairs = list(zip(overrides, parsed, strict=True))
    fixed = [line for line, o in pairs if not o.is_sweep_override()]
    composed = compose(config_name=config_name, overrides=fixed, return_hydra_config=True)
    hydra_cfg = composed.hydra
    _require_static_dir(hydra_cfg, "sweep")
    _refuse_earlier_jobs(composed, None, trains=preflight_jobs)
    target = str(OmegaConf.select(hydra_cfg, "sweeper._target_", default=""))
    if needs_objective(target):
        _check_search_settings(hydra_cfg.sweeper)
    params = OmegaConf.select(hydra_cfg, "sweeper.params", default=None) or {}
    lines = [f"{k}={v}" for k, v in params.items()] + overrides  # a later line wins, as in Hydra
    basic = target == BASIC_SWEEPER
    jobs = _Jobs(
        config_name,
        _axes(parser.parse_overrides(lines), basic),
        [line for line, o in pairs if o.is_hydra_override()],
        hydra_cfg.sweeper if needs_objective(target) else None,
        basic,
        preflight_jobs,
    )
    checked = _check_jobs(jobs)
    _check_output_dirs(jobs, checked, OmegaConf.select(hydra_cfg, "sweeper.n_trials", default=None))
    taken = {  # resolved, as ``job_dirs`` lists them
        str(Path(out.job_dir).resolve())
        for n in checked
        if basic and isinstance(out := jobs.check(n), _JobDir)
    }
    _refuse_earlier_jobs(composed, taken, trains=preflight_jobs)


def _check_search_settings(sweeper: DictConfig) -> None:
    """The Optuna sweeper's trial count and direction are ones Optuna takes (it refused them
    once the sweep had started, with a traceback)."""
    n_trials = sweeper.get("n_trials")
    require(
        isinstance(n_trials, int) and not isinstance(n_trials, bool) and n_trials >= 1,
        "hydra.sweeper.n_trials",
        f"must be >= 1, got {n_trials!r}",
    )
    direction = sweeper.get("direction")
    directions = list(direction) if isinstance(direction, ListConfig) else [direction]
    require(
        all(d in ("minimize", "maximize") for d in directions),
        "hydra.sweeper.direction",
        f"must be minimize or maximize (the final eval/pass@1: maximize), got {direction!r}",
    )


class _JobDir(NamedTuple):
    """Where a job's trainer writes (absolute), and the key that put it there."""

    path: str
    key: str
    """``trainer.output_dir``, or ``hydra.sweep.subdir`` for the job's own directory."""
    cfg: SkyRLConfig
    """The job's validated config."""
    job_dir: str
    """Hydra's directory of the job (absolute), where its ``.hydra`` goes."""


class _Jobs:
    """The jobs of a sweep (a search sweeper's: its search-space points), numbered as Hydra
    numbers them (the last key varies fastest), each composed and validated at most once."""

    def __init__(self, config_name: str, axes: list[list[str]], hydra_lines: list[str],
                 search: DictConfig | None, basic: bool, preflight: bool):  # fmt: skip
        self.config_name, self.axes, self.hydra_lines = config_name, axes, hydra_lines
        self.search, self.basic, self.preflight = search, basic, preflight
        self.count = math.prod(len(axis) for axis in axes)
        self._outcomes: dict[tuple[int, int], Exception | _JobDir] = {}

    def indices(self, number: int) -> tuple[int, ...]:
        """Which value of each key job ``number`` takes."""
        found = []
        for axis in reversed(self.axes):
            number, index = divmod(number, len(axis))
            found.append(index)
        return tuple(reversed(found))

    def first_holding(self, key: int, index: int) -> int:
        """The number of the first job taking value ``index`` of key ``key``."""
        return math.prod(len(axis) for axis in self.axes[key + 1 :]) * index

    def label(self, number: int) -> str:
        point = [axis[i] for axis, i in zip(self.axes, self.indices(number), strict=True)]
        return _job_label(tuple(point), self.axes, number, self.count, self.basic)

    def check(self, number: int, as_job: int | None = None) -> Exception | _JobDir:
        """What composing and validating job ``number`` (then its start-of-run checks, if
        ``preflight``) raised, else where it writes; run as Hydra's job ``as_job`` (default:
        ``number``: the start-of-run checks only then, once per job)."""
        key = (number, number if as_job is None else as_job)
        if key not in self._outcomes:
            point = [axis[i] for axis, i in zip(self.axes, self.indices(number), strict=True)]
            outcome = self._outcome([*self.hydra_lines, *point], key[1])
            if self.preflight and key[0] == key[1] and isinstance(outcome, _JobDir):
                outcome = self._preflight(number, outcome)
            self._outcomes[key] = outcome
        return self._outcomes[key]

    def _preflight(self, number: int, job: _JobDir) -> Exception | _JobDir:
        """What job ``number``'s run checks before it starts anything (``skyrl.train``: its
        run dir, then the pre-flight as a dry run), as a ``SweepJobError`` naming the job.
        What the checks print (a dropped-prompts warning) the job prints again: not here."""
        from skyrl.config.preflight import check_run_dir, preflight

        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                check_run_dir(job.cfg, Path(job.path))
                preflight(job.cfg, for_run=False)
        except Exception as exc:  # bad input and bugs alike: the cause tells them apart
            failure = SweepJobError(exc, self.label(number))
            failure.__cause__ = exc
            return failure
        return job

    def check_alone(self, key: int, index: int) -> Exception | None:
        """What the fixed lines with value ``index`` of the swept key ``key`` (the other swept
        keys left at their defaults) raised, if anything."""
        lines = [a[index] if k == key else a[0] for k, a in enumerate(self.axes)
                 if k == key or len(a) == 1]  # fmt: skip
        outcome = self._outcome([*self.hydra_lines, *lines], 0)
        return outcome if isinstance(outcome, Exception) else None

    def _outcome(self, overrides: list[str], number: int) -> Exception | _JobDir:
        try:  # composed here: Hydra's own errors are bad input (``is_bad_input``)
            cfg = compose(self.config_name, overrides, return_hydra_config=True)
            return _check_job(cfg, number, self.search)
        except Exception as exc:  # bad input and bugs alike: the caller tells them apart
            return exc


def _check_jobs(jobs: _Jobs) -> list[int]:
    """Raise for the first job that fails; the numbers of the jobs checked, all of them up to
    ``MAX_SWEEP_JOBS_CHECKED``. A value that fails alone (against the other swept keys'
    defaults) refuses the sweep only if a job taking it fails too."""
    swept = [k for k, axis in enumerate(jobs.axes) if len(axis) > 1]
    if len(swept) <= 1:  # each job is one value alone: its error is the plainest message
        for number in range(jobs.count):
            outcome = jobs.check(number)
            if isinstance(outcome, Exception):
                raise outcome
        return list(range(jobs.count))
    alone = {
        (k, i): exc
        for k in swept
        for i in range(len(jobs.axes[k]))
        if (exc := jobs.check_alone(k, i)) is not None
    }
    capped = jobs.count > MAX_SWEEP_JOBS_CHECKED
    numbers = list(range(jobs.count))
    if capped:  # jobs 0 and 1 (their output dirs) and the first job taking each failed value
        numbers = sorted({0, 1} | {jobs.first_holding(k, i) for k, i in alone})
    failed: dict[int, Exception] = {}
    for number in numbers:
        outcome = jobs.check(number)
        if isinstance(outcome, Exception):
            failed[number] = outcome
            if not alone:  # the first failing job is the one to report
                break
    if failed:
        raise _first_failure(jobs, numbers, failed, alone)
    if capped:
        what = "jobs" if jobs.basic else "search-space points"
        print(
            f"warning: the sweep has {jobs.count} {what}, more than the "
            f"{MAX_SWEEP_JOBS_CHECKED} the precheck composes one by one: each swept value was "
            "checked alone, not every combination",
            file=sys.stderr,
        )
    return numbers


def _first_failure(jobs: _Jobs, numbers: list[int], failed: dict[int, Exception],
                   alone: dict[tuple[int, int], Exception]) -> Exception:  # fmt: skip
    """The first failing job's error: the plain error of one of its values, when that value
    failed alone with the very same line and fails in every checked job that takes it; else
    the job's error with its number and values."""
    first = min(failed)
    if isinstance(failed[first], SweepJobError):  # a start-of-run check's: names its job
        return failed[first]
    line, taken = one_line_error(failed[first]), jobs.indices(first)
    for (key, index), exc in alone.items():
        if taken[key] != index or one_line_error(exc) != line:
            continue
        if all(n in failed for n in numbers if jobs.indices(n)[key] == index):
            return exc
    return SweepJobError(failed[first], jobs.label(first))


def _check_output_dirs(jobs: _Jobs, numbers: list[int], n_trials: object) -> None:
    """Refuse two jobs writing to one directory: the later would resume the earlier's last
    checkpoint (``trainer.resume=auto``), train no step and be recorded ok with its metrics.
    A search sweeper may sample one point twice, so there the directory must name the trial
    (checked on the first point, as trials 0 and 1)."""
    if not jobs.basic:
        if n_trials == 1:
            return
        first, second = jobs.check(0, as_job=0), jobs.check(0, as_job=1)
        assert isinstance(first, _JobDir) and isinstance(second, _JobDir)  # point 0 passed
        if first.path == second.path:
            raise _shared_dir_error(second, 0, 1, "trials 0 and 1", "trial")
        return
    seen: dict[str, int] = {}
    for number in numbers:
        out = jobs.check(number)
        assert isinstance(out, _JobDir)  # every job checked passed
        if out.path in seen:
            who = f"jobs {seen[out.path]} and {number} of {jobs.count}"
            raise _shared_dir_error(out, seen[out.path], number, who, "job")
        seen[out.path] = number


def _shared_dir_error(out: _JobDir, earlier: int, later: int, who: str, noun: str) -> ConfigError:
    """``trainer.output_dir`` (or ``hydra.sweep.subdir``) naming one directory for two jobs."""
    if out.key == "trainer.output_dir":
        swept = ", sweep it" if noun == "job" else ""
        fix = (
            f"leave trainer.output_dir unset so each {noun} writes to its own sweep subdir"
            f"{swept}, or make it per {noun} (e.g. trainer.output_dir={out.path}/"
            "${hydra:job.num})"
        )
    else:
        fix = f"make it per {noun}, e.g. hydra.sweep.subdir=${{hydra.job.num}} (Hydra's default)"
    return ConfigError(
        out.key,
        f"{out.path}: {who} both write there ({noun} {later} would resume {noun} {earlier}'s "
        f"checkpoints); {fix}",
    )


def _refuse_earlier_jobs(composed: DictConfig, taken: set[str] | None, trains: bool = True) -> None:
    """Refuse a sweep dir that holds job dirs already: their rows would join this sweep's
    summary (``skyrl.sweeps`` reads every job dir under it), and this sweep's job N would
    resume the checkpoints an earlier job N left in its dir (``trains``; an eval's would
    write over its results). A dry run's job dir is refused
    only when no job of this sweep takes it over: ``taken`` holds its jobs' dirs once they
    are checked; None before, when dry runs' dirs wait for that."""
    from skyrl.sweeps import job_dirs

    with _as_job(composed, 0):
        sweep_dir = Path(str(OmegaConf.select(composed, "hydra.sweep.dir")))
    if taken is None:  # a dry run's dir waits for the jobs' dirs
        found = [d for d in job_dirs(sweep_dir) if not _dry_run_dir(d)]
    else:
        found = [d for d in job_dirs(sweep_dir) if _dry_run_dir(d) and str(d) not in taken]
    if not found:
        return
    names = sorted((str(d.relative_to(sweep_dir.resolve())) for d in found),
                   key=lambda name: (len(name), name))  # fmt: skip
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    takes_over = "resume the checkpoints" if trains else "write over the results"
    harm = (
        f"would join this sweep's summary.csv and this sweep's jobs would {takes_over} in theirs"
        if taken is None
        else "would join this sweep's summary.csv (no job of this sweep takes them over)"
    )
    raise ConfigError(
        "hydra.sweep.dir",
        f"{sweep_dir} already holds the job dirs of an earlier "
        f"{'sweep' if taken is None else 'dry-run sweep'} ({shown}): their rows {harm}; "
        "choose a new hydra.sweep.dir or remove them",
    )


def _dry_run_dir(job_dir: Path) -> bool:
    """Whether ``job_dir`` is a dry-run job's (its config says ``trainer.dry_run`` and it holds
    no checkpoints): a job taking it over resumes nothing and rewrites what it holds."""
    try:
        saved = OmegaConf.load(job_dir / ".hydra" / "config.yaml")
    except Exception:  # missing or damaged: not known to be a dry run's
        return False
    dry_run = OmegaConf.select(saved, "trainer.dry_run", default=False) is True
    return dry_run and not (job_dir / "checkpoints").exists()


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


def _require_static_dir(hydra_cfg: DictConfig, which: str) -> None:
    """Hydra makes ``hydra.<which>.dir`` before the job starts: the part of it before its
    first interpolation (``${now:...}`` is resolved only when Hydra runs) can be a
    directory: no file in the way, writable."""
    section = OmegaConf.to_container(hydra_cfg[which], resolve=False)
    assert isinstance(section, dict)  # hydra.run / hydra.sweep are mappings
    raw = str(section["dir"])
    static, interpolated, _ = raw.partition("${")
    folder = Path(static)
    if interpolated and not static.endswith("/"):  # outputs/run_${now:...}: outputs is made
        folder = folder.parent
    require_dir(folder, f"hydra.{which}.dir")


def _check_job(cfg: DictConfig, number: int | None, search: DictConfig | None) -> _JobDir:
    """Validate one job's config (composed with Hydra's) as Hydra's job ``number`` (None: a
    single run); where its trainer writes. Under a ``search`` sweeper (its config), the job
    must return an objective, and a dry run must not write into a persistent study."""
    with _as_job(cfg, number) as (task, job_dir):
        typed = validate(task)
    # hydra.job.chdir: the job runs in its own directory, where a relative path resolves
    here = job_dir if OmegaConf.select(cfg, "hydra.job.chdir", default=False) else os.getcwd()
    if search is not None:
        _require_eval(typed)
        if typed.trainer.dry_run and search.get("storage"):
            raise ConfigError(
                "hydra.sweeper.storage",
                "a dry run tells the study a placeholder objective for each trial, which this "
                "storage would keep; dry-run without it (hydra.sweeper.storage=null)",
            )
    if typed.trainer.output_dir:  # ``skyrl.cli.run``: it wins over the job's own dir
        out = os.path.join(here, typed.trainer.output_dir)  # an absolute one stays itself
        return _JobDir(os.path.abspath(out), "trainer.output_dir", typed, job_dir)
    return _JobDir(job_dir, "hydra.sweep.subdir", typed, job_dir)


@contextmanager
def _as_job(cfg: DictConfig, number: int | None) -> Iterator[tuple[DictConfig, str]]:
    """``cfg`` (composed with Hydra's config) as Hydra hands it to job ``number`` of a sweep
    (None: a single run): Hydra's config current, so ``${hydra:...}`` resolves as in the job
    (``hydra.core.utils.run_job``); yields the task config and the job's directory."""
    hydra = HydraConfig.instance()
    before = hydra.cfg
    which = "run" if number is None else "sweep"
    try:
        if number is not None:  # as the launchers number a sweep's jobs
            with read_write(cfg.hydra.job), open_dict(cfg.hydra.job):
                cfg.hydra.job.id, cfg.hydra.job.num = number, number
        hydra.set_config(cfg)
        job_dir = str(OmegaConf.select(cfg, f"hydra.{which}.dir"))
        if number is not None:
            job_dir = os.path.join(job_dir, str(OmegaConf.select(cfg, "hydra.sweep.subdir")))
        with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
            cfg.hydra.runtime.output_dir = os.path.abspath(job_dir)
        hydra.set_config(cfg)
        task = copy.deepcopy(cfg)
        with read_write(task), open_dict(task):
            del task["hydra"]
        yield task, os.path.abspath(job_dir)
    finally:
        hydra.cfg = before


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
