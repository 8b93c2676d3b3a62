"""The ``skyrl-train`` entry point (also ``python -m skyrl``).

Hydra composes the config from ``skyrl/conf`` (shipped inside the package, so
it works from any directory and from a non-editable install). Before Hydra's
own main runs, the command line is composed and validated once here, so that a
typo, a wrong type, an unknown option or a violated rule ends with ONE line
naming the key instead of a traceback. Then ``skyrl.train`` runs the pre-flight check
(``skyrl.config.preflight``: data files and rows, prompt lengths, model paths, the env,
the rollout driver), for a dry run too; what it finds is a ``ConfigError`` as well: one
``error:`` line naming the key, exit 2, before Ray or any engine starts. A sweep is
checked whole (every job, its pre-flight too) before its first job starts; a job that fails
anyway ends the sweep with the line and exit code a single run would give, after Hydra's line
naming the job's overrides. A run that fails once started (a worker or engine dying, an
exception raised in a worker, such as a user's policy loss raising, env calls hung past
``environment.max_hung_calls``) ends with one ``error:`` line, exit 1; the worker's exception
names where it was raised.

Ctrl-C (SIGINT) and SIGTERM end a run, and a sweep (no later job starts), with one line
naming the checkpoint ``trainer.resume=auto`` continues from, and exit code 128 + the
signal (130, 143), after the run's cleanup (``skyrl.train`` stops its workers and engines in
a ``finally``). The process then ends with ``os._exit`` once the exit handlers have run:
Python's own finalization would run the garbage collector over Ray's and the engines'
remains (it aborted with SIGABRT after a SIGTERM) and log the interrupted generation's
pending asyncio tasks.
"""

from __future__ import annotations

import argparse
import atexit
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import hydra
from hydra._internal.utils import get_args_parser
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf

from skyrl.api import TrainResult, config_error_line, train
from skyrl.config import precheck, register_configs
from skyrl.config.cli_errors import one_line_error
from skyrl.config.errors import ConfigError, did_you_mean, exception_line
from skyrl.config.help import command_help, wants_help
from skyrl.config.precheck import needs_objective
from skyrl.models.resolve import ModelNotFoundError
from skyrl.tracking import metric_names as names

EXIT_CONFIG_ERROR = 2
EXIT_RUN_FAILED = 1
HYDRA_COMMANDS = "--run, --multirun, --cfg, --info, --shell-completion"
"""Hydra's flags that each pick what the command does: it takes one at a time."""

TRAIN_SUMMARY = (
    "Train a language model with RL: rollouts through vLLM or transformers engines, rewards "
    "from an environment, advantages, one optimizer step per mini-batch on DeepSpeed workers "
    "(Ray actors). With no arguments: the main job, GRPO on SmolLM2-135M-Instruct with the "
    "built-in arithmetic task."
)
TRAIN_EXAMPLES = (
    ("skyrl-train experiment=smoke", "a tiny random model, about a minute"),
    ("skyrl-train algorithm=rloo generator=hf", "RLOO, the transformers engine"),
    ("skyrl-train trainer.train_batch_size=16", "override any key"),
    ("skyrl-train trainer.dry_run=true", "validate, print the run plan, exit"),
    ("skyrl-train -m algorithm=grpo,rloo", "a sweep: one output dir per job"),
    ("skyrl-train hydra.run.dir=<run dir>", "continue a stopped run from its last checkpoint"),
)


def run(cfg: DictConfig) -> TrainResult:
    """The Hydra task: train in Hydra's run (or sweep job) directory unless
    ``trainer.output_dir`` is set."""
    return train(cfg, _output_dir(cfg))


def _output_dir(cfg: DictConfig) -> str:
    """``trainer.output_dir`` (``~`` expanded, as ``skyrl.train`` does), else Hydra's."""
    from hydra.core.hydra_config import HydraConfig

    configured = cfg.trainer.get("output_dir")
    return os.path.expanduser(configured) if configured else HydraConfig.get().runtime.output_dir


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, with the line that ends the run (or the sweep) and its exit code. A
    ``KeyboardInterrupt``: Hydra's launchers record an ``Exception`` as a failed job and go
    on to the next; this ends the sweep."""

    def __init__(self, signum: int, line: str = ""):
        super().__init__(signum, line)
        self.signum, self.line = signum, line

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class JobFailed(CompactHydraException):
    """A sweep job that failed as a single run would, with its one ``error:`` line and exit
    code. The job still fails in Hydra's sense (recorded, marked in the sweep summary, the
    sweeper decides what follows); when it ends the sweep, ``main`` prints the line alone."""

    def __init__(self, line: str, exit_code: int):
        super().__init__(line, exit_code)  # both in args: it pickles back from a joblib worker
        self.line, self.exit_code = line, exit_code

    def __str__(self) -> str:
        return self.line


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    """Returns the final held-out pass@1 (a sweeper's objective), if the run evaluated.

    A single run ends with one error line and an exit code; in a multirun the job raises
    ``JobFailed`` with that line and code instead (Hydra records the job as failed). Ctrl-C
    or SIGTERM, once the run has cleaned up, raises ``Interrupted`` with its line, which
    ``main`` prints, in a sweep too (it ends the sweep)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from skyrl.generators.agent_loop import EnvHangError
    from skyrl.inference.client import EngineDiedError
    from skyrl.trainer.trainer import TrainingAborted
    from skyrl.workers.group import WorkerDiedError

    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        result = run(cfg)
    except ConfigError as exc:
        fail_job(one_line_error(exc), EXIT_CONFIG_ERROR, multirun, exc)
    except ModelNotFoundError as exc:  # a config value naming nothing: its key, then what was tried
        fail_job(f"error: {exc}", EXIT_CONFIG_ERROR, multirun, exc)
    except (WorkerDiedError, EngineDiedError, EnvHangError, TrainingAborted) as exc:
        fail_job(f"error: {exc}", EXIT_RUN_FAILED, multirun, exc)
    except Exception as exc:
        line = raised_in_ray_line(exc)
        if line is None:  # a bug of the driver's: Hydra's trimmed traceback
            raise
        fail_job(line, EXIT_RUN_FAILED, multirun, exc)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM: the run cleaned up
        signum = _signal_of(exc)
        raise Interrupted(signum, interrupted_line(Path(_output_dir(cfg)), signum)) from None
    if multirun and needs_objective(str(HydraConfig.get().sweeper.get("_target_", ""))):
        return sweep_objective(cfg, result, HydraConfig.get().sweeper.get("direction"))
    objective = result.final(names.EVAL_PASS_AT_1)
    return None if math.isnan(objective) else objective


RAY_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
"""A frame of the traceback text Ray carries over from the process that raised."""


def raised_in_ray_line(exc: BaseException) -> str | None:
    """The one line for an exception raised inside a Ray worker (a policy loss or a reward
    function of the user's, say) that ends the run, or None for one raised here. A worker
    group re-raises it as a ``RuntimeError`` naming role, rank and cause
    (``WorkerGroup.get``), from Ray's ``RayTaskError``; Hydra printed both tracebacks, the
    worker's inside Ray's text. The line names where the worker raised it: the last frame of
    that text."""
    from ray.exceptions import RayTaskError

    task_error = exc if isinstance(exc, RayTaskError) else exc.__cause__
    if not isinstance(task_error, RayTaskError):
        return None
    what = (
        str(exc)
        if task_error is not exc
        else f"a Ray task failed: {exception_line(task_error.cause)}"
    )
    frames = RAY_FRAME.findall(str(task_error))
    where = f" (raised at {frames[-1][0]}:{frames[-1][1]}, in {frames[-1][2]})" if frames else ""
    return f"error: {what}{where}"


def fail_job(line: str, exit_code: int, multirun: bool, cause: Exception) -> NoReturn:
    """End a single run with ``line`` on stderr and ``exit_code``; fail a sweep job with both
    (``skyrl-train`` and ``skyrl-eval`` alike)."""
    if multirun:
        raise JobFailed(line, exit_code) from cause
    print(line, file=sys.stderr)
    sys.exit(exit_code)


def sweep_objective(cfg: DictConfig, result: TrainResult, direction: object) -> float:
    """What a job tells a search sweeper (Optuna): the final eval/pass@1. A dry run has none;
    Optuna needs a number to end the trial (it fails a trial without one, then the study
    without a completed trial), so it gets the worst value there is, which never counts as the
    best (the precheck refuses a dry run into a persistent ``hydra.sweeper.storage``)."""
    if cfg.trainer.dry_run:
        worst = math.inf if "minimize" in str(direction) else -math.inf
        print(f"dry run: no objective; the sweeper is told {worst} for this trial", flush=True)
        return worst
    objective = result.final(names.EVAL_PASS_AT_1)
    if math.isnan(objective):  # the precheck makes sure there are eval prompts to begin with
        key = "data.eval_files" if cfg.data.source == "files" else "data.num_eval_prompts"
        raise JobFailed(
            f"error: {key}: the run logged no eval/pass@1 to return as the sweep objective "
            "(were all eval prompts dropped as over-long?)",
            EXIT_CONFIG_ERROR,
        )
    return objective


def check_command_line() -> None:
    """Compose and validate ``sys.argv`` once; a problem is one line on stderr and exit 2
    (``skyrl-train`` and ``skyrl-eval`` alike)."""
    register_configs()
    argv = sys.argv[1:]
    problem = hydra_flags_problem(argv)
    if problem is None:
        composed = precheck.command_line_problem(with_config_dir(argv))
        problem = package_problem(argv) if composed is None else config_error_line(composed)
    if problem is not None:
        print(problem, file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


def hydra_flags_problem(argv: list[str]) -> str | None:
    """The one-line error for Hydra's own flags where Hydra refuses them, or None: a flag it
    does not know or a value it does not take, an override past the flag that ended the
    overrides (argparse printed its usage block, then a line), flags it takes one at a time
    (a ``ValueError``, printed as a traceback), a ``--config-dir`` that is no directory, a
    ``--config-path`` Hydra finds no primary config in (``config_path_problem``)."""
    parser = get_args_parser()
    parser.exit_on_error = False  # an ArgumentError is raised instead of the usage block
    try:
        args, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        return f"error: {exc.argument_name}: {exc.message}"
    if unknown:
        return _unknown_argument_line(unknown[0])
    commands = [
        flag
        for flag, given in (
            ("--run", args.run),
            ("--multirun", args.multirun),
            ("--cfg", args.cfg is not None),
            ("--info", args.info is not None),
            ("--shell-completion", args.shell_completion),
        )
        if given
    ]
    if len(commands) > 1:
        line = f"error: {commands[0]} and {commands[1]}: Hydra takes one of {HYDRA_COMMANDS}"
        if commands[:2] == ["--multirun", "--cfg"]:
            line += " (to print a sweep job's config: --cfg job with its overrides, without -m)"
        return line
    if args.shell_completion and not args.help:
        return shell_completion_problem(args.overrides)
    if args.resolve and args.cfg is None and not args.help:
        return "error: --resolve: only with --cfg (it resolves the config --cfg prints)"
    if args.package is not None and args.cfg is None and not args.help:
        return "error: --package: only with --cfg (it picks the part of the config --cfg prints)"
    if args.config_dir is not None and not os.path.isdir(args.config_dir):
        return f"error: --config-dir: {os.path.abspath(args.config_dir)}: no such directory"
    if args.config_path is not None:
        return config_path_problem(args.config_path, args.config_name or "config")
    return None


SHELL_COMPLETION_COMMANDS = ("install", "uninstall", "query")


def shell_completion_problem(overrides: list[str]) -> str | None:
    """The one-line error for ``--shell-completion`` without exactly one of
    ``install=SHELL``, ``uninstall=SHELL``, ``query=SHELL`` naming a shell Hydra completes
    (Hydra raised a ``ValueError``, printed as a traceback), or None."""
    from hydra.core.plugins import Plugins
    from hydra.plugins.completion_plugin import CompletionPlugin

    plugins = Plugins.instance().discover(CompletionPlugin)
    shells = sorted(p.provides() for p in plugins if issubclass(p, CompletionPlugin))
    usage = f"takes one of install=SHELL, uninstall=SHELL, query=SHELL (SHELL: {', '.join(shells)})"
    parts = (o.partition("=") for o in overrides)
    given = [(cmd, shell) for cmd, _, shell in parts if cmd in SHELL_COMPLETION_COMMANDS]
    if len(given) != 1:
        named = f"{' and '.join(cmd for cmd, _ in given)}: " if given else ""
        return f"error: --shell-completion: {named}{usage}"
    command, shell = given[0]
    if shell not in shells:
        return f"error: --shell-completion: {command}={shell}: no such shell; {usage}"
    return None


_ABSENT = object()


def package_problem(argv: list[str]) -> str | None:
    """The one-line error for a ``--package`` that names nothing in the config ``--cfg``
    prints (Hydra said ``package 'x' not found in config``, no ``error:``, exit 1), or None.
    The config is composed as ``--cfg`` composes it (the Hydra node only in ``--cfg hydra``
    and ``--cfg all``); left to Hydra with ``--config-path`` (a config tree not skyrl's)."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    args, _ = get_args_parser().parse_known_args(argv)
    package = args.package
    if args.cfg is None or package in (None, "_global_") or args.config_path or args.help:
        return None
    overrides = get_args_parser().parse_known_args(with_config_dir(argv))[0].overrides
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose(args.config_name or "config", overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # ${hydra:...} resolves, as when Hydra prints it
    printed = cfg if args.cfg == "all" else OmegaConf.masked_copy(cfg, _printed_keys(cfg, args.cfg))
    if OmegaConf.select(printed, package, default=_ABSENT) is not _ABSENT:
        return None
    parent, _, leaf = package.rpartition(".")
    node = OmegaConf.select(printed, parent, default=None) if parent else printed
    hint = did_you_mean(leaf, [str(k) for k in node]) if isinstance(node, DictConfig) else ""
    if args.cfg == "job" and package.split(".")[0] == "hydra":
        hint = " (Hydra's own config: --cfg hydra prints it)"
    return f"error: --package: {package}: no such key in the config --cfg {args.cfg} prints{hint}"


def _printed_keys(cfg: DictConfig, cfg_type: str) -> list[str]:
    """The top-level keys ``--cfg job`` (all but ``hydra``) or ``--cfg hydra`` prints."""
    return [str(k) for k in cfg if (k == "hydra") == (cfg_type == "hydra")]


def config_path_problem(config_path: str, config_name: str) -> str | None:
    """The one-line error for a ``--config-path`` that is no config folder, or one without the
    primary config ``config_name`` (Hydra said either in several lines, exit 1); None if
    fine. Looked up where Hydra looks: a relative path inside the ``skyrl`` package (relative
    to the module declaring ``@hydra.main``), not in the working directory."""
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.core_plugins.importlib_resources_config_source import (
        ImportlibResourcesConfigSource,
    )
    from hydra._internal.utils import (
        compute_search_path_dir,
        detect_calling_file_or_module_from_task_function,
    )

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(_hydra_main)
    where = compute_search_path_dir(calling_file, calling_module, config_path)
    assert where is not None  # a --config-path is given
    in_package = where.startswith("pkg://")
    source = (ImportlibResourcesConfigSource if in_package else FileConfigSource)("main", where)
    if not source.available():
        if config_path.startswith("pkg://"):
            return f"error: --config-path: {config_path}: no such package (with an __init__.py)"
        if not in_package:
            return f"error: --config-path: {config_path}: no such directory"
        here = os.path.abspath(config_path)
        fix = (
            f"for {here}, give that absolute path"
            if os.path.isdir(here)
            else "give an absolute path"
        )
        return (
            f"error: --config-path: {config_path}: no such folder in the skyrl package ({source.path}: "
            f"Hydra reads a relative --config-path there, not in the working directory); {fix}"
        )
    if not source.is_config(config_name):
        name = config_name if config_name.endswith(".yaml") else f"{config_name}.yaml"
        return (
            f"error: --config-path: {config_path}: no {name} in it (the primary config; "
            "--config-name names another)"
        )
    return None


def _unknown_argument_line(argument: str) -> str:
    """The line for the first argument Hydra's parser leaves over: a flag it does not know, or
    an override that is not in the one unbroken run of overrides argparse takes."""
    if argument.startswith("-"):
        return f"error: {argument}: no such flag (--help lists the command's, --hydra-help Hydra's)"
    return (
        f"error: {argument}: an override after a flag that follows other overrides; give "
        "Hydra's flags (-m, --cfg job, ...) before or after all the overrides"
    )


def with_config_dir(argv: list[str]) -> list[str]:
    """``argv`` as the command-line check composes it: ``--config-dir DIR`` (skyrl's configs
    plus the user's own, such as ``DIR/experiment/mine.yaml``) becomes the override
    ``hydra.searchpath=[file://DIR]``, which puts DIR where Hydra's flag puts it (after
    skyrl's configs, before the schemas). The check skips a command line with the flag itself,
    and a typo then ended in Hydra's several lines and exit 1. Left as it is: no
    ``--config-dir``, with ``--config-path`` (a config tree that is not skyrl's), a flag for
    which nothing is composed (``--info``), the user's own ``hydra.searchpath``, or a DIR that
    needs quoting."""
    args, _ = get_args_parser().parse_known_args(argv)
    config_dir = args.config_dir
    if (
        config_dir is None
        or args.config_path is not None
        or args.hydra_help
        or args.info
        or args.shell_completion  # the check composes nothing for these
        or any(o.lstrip("+").startswith("hydra.searchpath") for o in args.overrides)
        or any(c in config_dir for c in "'\\")
    ):
        return argv
    flags = ["-m"] if args.multirun else []
    flags += ["--config-name", args.config_name] if args.config_name else []
    search_path = f"hydra.searchpath=['file://{os.path.abspath(config_dir)}']"
    return [*flags, *args.overrides, search_path]


def interrupted_line(output_dir: Path, signum: int) -> str:
    """The line a run stopped by ``signum`` ends with: the checkpoint a resume continues from."""
    from skyrl.trainer.checkpoint import CheckpointManager

    what = _stopped_by(signum)
    try:
        latest = CheckpointManager(output_dir / "checkpoints", 0).resumable()
    except (OSError, ValueError):  # a pointer to an incomplete checkpoint
        latest = None
    if latest is None:
        return f"{what}; no checkpoint was saved"
    return f"{what}; last checkpoint: {latest} (trainer.resume=auto continues from it)"


def _stopped_by(signum: int) -> str:
    if signum == signal.SIGINT:
        return "interrupted"
    return f"terminated ({signal.Signals(signum).name})"


def main() -> None:
    """Console script: check the command line, then hand it to Hydra. Ctrl-C and SIGTERM end
    the run or sweep with one line (``Interrupted``)."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if in_main_thread else None
    try:
        if wants_help(sys.argv[1:]):
            print(command_help("skyrl-train", TRAIN_SUMMARY, TRAIN_EXAMPLES, sys.argv[1:]))
            return
        check_command_line()
        if not get_args_parser().parse_known_args(sys.argv[1:])[0].multirun:
            _hydra_main()
        else:
            run_sweep(_hydra_main)
    except KeyboardInterrupt as exc:
        # outside a job (composing, between a sweep's jobs) there is no run to name
        done = exc if isinstance(exc, Interrupted) else Interrupted(_signal_of(exc))
        print(done.line or _stopped_by(done.signum), file=sys.stderr)
        _exit_now(done.exit_code)
    finally:
        _terminated.clear()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_terminated: list[int] = []
"""The SIGTERM received, if one was: Ray turns an exception a signal handler raises inside
``ray.get`` into a plain ``KeyboardInterrupt``."""


def _raise_interrupted(signum: int, frame: object) -> None:
    """The SIGTERM handler: interrupt the main thread as Ctrl-C does, once (a second SIGTERM
    while the run cleans up is ignored)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _terminated.append(signum)
    raise Interrupted(signum)


def _signal_of(exc: KeyboardInterrupt) -> int:
    """The signal that raised ``exc``: SIGTERM once one came, else SIGINT (Ctrl-C)."""
    if isinstance(exc, Interrupted):
        return exc.signum
    return _terminated[0] if _terminated else signal.SIGINT


def _exit_now(exit_code: int) -> NoReturn:
    """End the process with ``exit_code`` after the exit handlers (``ray.shutdown``, the
    logging flush), skipping the interpreter's finalization (see the module docstring)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def run_sweep(hydra_main: Callable[[], object]) -> None:
    """``hydra_main`` (a ``@hydra.main`` function) for a multirun, where a job's ``JobFailed``
    that ends the sweep prints as its one line and exits with its code. Hydra would print any
    exception with a hint to set HYDRA_FULL_ERROR; with it set, Hydra raises instead, and
    whatever else ends the sweep goes back to Hydra's reporter. A user's own
    HYDRA_FULL_ERROR is left alone."""
    if "HYDRA_FULL_ERROR" in os.environ:
        hydra_main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except JobFailed as exc:
        print(exc, file=sys.stderr)
        sys.exit(exc.exit_code)
    except Exception as exc:
        os.environ.pop("HYDRA_FULL_ERROR")
        _report_as_hydra(exc)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)


def _report_as_hydra(exc: Exception) -> NoReturn:
    """Print ``exc`` as Hydra would have and exit 1: re-raised from below Hydra's own
    reporter, whose frames Hydra skips, looking for the job's frame within its first ten."""
    from hydra._internal.utils import run_and_report

    below, tb = exc.__traceback__, exc.__traceback__
    while tb is not None:  # run_and_report appears twice: where it called, where it re-raised
        below = tb.tb_next if tb.tb_frame.f_code.co_name == "run_and_report" else below
        tb = tb.tb_next
    trimmed = exc.with_traceback(below)

    def reraise() -> NoReturn:
        raise trimmed

    run_and_report(reraise)  # exits 1
    sys.exit(EXIT_RUN_FAILED)


if __name__ == "__main__":
    main()
