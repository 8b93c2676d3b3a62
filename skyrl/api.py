"""The Python API: compose a config, train, get the result. The CLI calls the same functions.

import skyrl
cfg = skyrl.compose(["experiment=smoke", "trainer.total_steps=3"])
result = skyrl.train(cfg)
result.metric("generate/reward_mean")   # [(step, value), ...]
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ValidationError

from skyrl.config.cli_errors import one_line_error, parse_reason
from skyrl.config.errors import ConfigError
from skyrl.config.precheck import check_group_values
from skyrl.config.preflight import Preflight, check_run_dir, preflight, start_row
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import validate, with_resolved_values
from skyrl.trainer.plan import format_plan, make_plan

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).parent / "conf"


@dataclass
class TrainResult:
    """What a run leaves behind."""

    output_dir: Path
    """The run directory (config, metrics.jsonl, plot, checkpoints, final_hf)."""
    history: list[dict[str, float]] = field(default_factory=list)
    """One metrics dict per logged step of the run (step 0 = eval before training, if any),
    read back from ``metrics.jsonl``: a resumed run's earlier steps too."""
    final_hf: Path | None = None
    """The exported policy (``from_pretrained``-loadable), if exported."""

    @property
    def checkpoint(self) -> Path | None:
        """The latest checkpoint of the run, if any."""
        from skyrl.trainer.checkpoint import CheckpointManager

        return CheckpointManager(self.output_dir / "checkpoints", 0).latest()

    def metric(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of every step that logged ``key``."""
        return [(int(r["step"]), r[key]) for r in self.history if key in r]

    def final(self, key: str) -> float:
        """The last logged value of ``key`` (nan if never logged)."""
        values = self.metric(key)
        return values[-1][1] if values else math.nan


def compose(
    overrides: Sequence[str] | Mapping[str, Any] = (), config_name: str = "config"
) -> DictConfig:
    """The config the CLI would build from these command-line overrides: a list of
    ``"key=value"`` strings, or a mapping (a dict or ``DictConfig``) whose items are
    ``key=value`` overrides, each value written as Hydra reads it back (a string quoted, a
    path as its string (``TrainResult.output_dir``), None as ``null``, lists and mappings as
    such, a mapping's keys escaped, numpy's values as Python's):
    ``{"experiment": "smoke", "trainer.total_steps": 3}`` is ``["experiment=smoke",
    "trainer.total_steps=3"]``, and a mapping value is merged into its node (``{"trainer":
    {"epochs": 2}}`` keeps the other ``trainer`` keys). A bad override (a config group set to
    no option's name, or a setting of Hydra's own job such as ``hydra.run.dir``, which a
    composed config has no place for, too) is a ``ConfigError`` naming it, as ``skyrl-train``'s
    ``error:`` line does (an unknown key with the nearest one, a value that does not parse, a
    sweep). A Hydra the caller initialized (a notebook's own configs) is left as it was."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    from skyrl.config import register_configs

    if not isinstance(config_name, str):  # None: Hydra's empty config, without the schema
        raise ConfigError(
            "config_name",
            f"{config_name!r} is not a config's name, one of {CONF_DIR}'s ({_config_names()})",
        )
    lines = _override_strings(overrides)
    _check_override_lines(lines)
    register_configs()
    callers = get_gh_backup() if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()  # initialize_config_dir refuses to nest in another
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            check_group_values(lines)
            return hydra_compose(config_name=config_name, overrides=lines)
    except Exception as exc:
        error = _compose_error(exc, config_name)
        if error is None:  # not bad input, or no key to name: Hydra's own error, whole
            raise
        raise error from None
    finally:
        if callers is not None:
            restore_gh_from_backup(callers)


def _override_strings(overrides: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """``compose``'s overrides as Hydra's ``key=value`` strings."""
    if isinstance(overrides, ListConfig):  # overrides.yaml: its ${...} kept as written
        items = OmegaConf.to_container(overrides, resolve=False)
        assert isinstance(items, list)
        return [str(item) for item in items]
    if isinstance(overrides, DictConfig):  # interpolations kept as written
        container = OmegaConf.to_container(overrides)
        assert isinstance(container, dict)
        overrides = {str(key): value for key, value in container.items()}
    if isinstance(overrides, Mapping):
        return [f"{key}={_override_value(value, key)}" for key, value in overrides.items()]
    if isinstance(overrides, str) or not isinstance(overrides, Iterable):
        # list() would split a str into characters
        got = "None" if overrides is None else f"the {type(overrides).__name__} {overrides!r}"
        raise TypeError(f"{_COMPOSE_TAKES}; got {got}")
    lines = list(overrides)
    for number, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(
                f"{_COMPOSE_TAKES}; override {number} is {_with_article(line)}: {line!r}"
            )
    return lines


_COMPOSE_TAKES = (
    "skyrl.compose takes a list of 'key=value' override strings, e.g. ['experiment=smoke'], "
    "or a mapping {key: value}"
)


def _with_article(value: object) -> str:
    """``an int``, ``a float``: the type of ``value`` in a sentence."""
    name = type(value).__name__
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _check_override_lines(lines: list[str]) -> None:
    """Raise a ``ConfigError`` naming the first line that does not parse, that is a sweep
    (Hydra's own error for the one does not name the line, for the other advises adding
    ``--multirun`` to a command line), that sets Hydra's own job (``hydra.run.dir``,
    ``hydra/launcher``: compose ran none, and dropped it without a word), or whose value reads
    Hydra's job config (``HYDRA_RESOLVER``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for line in lines:
        try:
            (override,) = parser.parse_overrides([line])
        except OverrideParseException as exc:
            raise ConfigError(line, f"cannot parse this override: {parse_reason(exc)}") from None
        if override.is_sweep_override():
            value = line.partition("=")[2]
            message = (
                f"'{value}' is a sweep, and skyrl.compose makes one config: compose one value "
                "at a time (skyrl-train -m runs sweeps)"
            )
            if getattr(override.value(), "simple_form", False):  # a,b: meant a list or a str?
                message += f", or write a list as [{value}] or a string as '{value}'"
            raise ConfigError(override.key_or_group, message)
        if override.is_hydra_override():
            raise ConfigError(
                override.key_or_group,
                "a setting of the Hydra job a command line runs (skyrl-train, skyrl-eval), and "
                "skyrl.compose makes the config outside one: it would change nothing; leave it "
                "out (the run directory: skyrl.train(cfg, output_dir=...) or trainer.output_dir)",
            )
        if HYDRA_RESOLVER.search(line.partition("=")[2]):
            raise ConfigError(
                override.key_or_group,
                f"'{line.partition('=')[2]}': ${{hydra:...}} resolves only in a job Hydra runs "
                "(skyrl-train, skyrl-eval), and skyrl.compose makes the config outside one: write "
                "the value it had (a sweep job's hydra:job.num is its directory's name)",
            )


HYDRA_RESOLVER = re.compile(r"\$\\?\{hydra\\?:")
"""``${hydra:...}`` in an override's value, also as a sweep job's ``overrides.yaml`` keeps it
(``$\\{hydra\\:job.num\\}``): the resolver reads the config of the Hydra job running, which
``compose`` has none of (``InterpolationResolutionError: HydraConfig was not set`` once
``skyrl.train`` resolved it)."""


def _config_names() -> str:
    """The names ``compose``'s ``config_name`` may take: the YAML files of ``CONF_DIR``."""
    return ", ".join(sorted(p.stem for p in CONF_DIR.glob("*.yaml")))


def _compose_error(exc: Exception, config_name: str) -> ConfigError | None:
    """Hydra's error for a bad override (or ``config_name``) as the ``ConfigError`` that
    ``skyrl-train``'s line shows (the key, then the message); None for a bug, or an error
    that names no key."""
    from hydra.errors import MissingConfigException

    from skyrl.config.cli_errors import is_bad_input

    if isinstance(exc, ConfigError) or not is_bad_input(exc):
        return None
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file == config_name:
        # Hydra's message went on with its search path, over four lines
        return ConfigError(
            "config_name", f"{config_name!r}: no such config in {CONF_DIR} ({_config_names()})"
        )
    key, named, message = config_error_line(exc).removeprefix("error: ").partition(": ")
    return ConfigError(key, message) if named and " " not in key else None


LIST_GOT_SCALAR = re.compile(r"Invalid value assigned: (\w+) is not a ListConfig, list or tuple")
"""OmegaConf's refusal of a scalar where the schema has a list (``key=all-linear``)."""


def config_error_line(exc: BaseException) -> str:
    """``one_line_error``, with the way to write a list where a scalar was given for one:
    OmegaConf's "str is not a ListConfig" named the key but not the fix."""
    if isinstance(exc, ConfigError):  # skyrl's own message (a sweep job's names the job)
        return one_line_error(exc)
    cause = exc if isinstance(exc, ValidationError) else exc.__cause__
    if not isinstance(cause, ValidationError) or not cause.full_key:
        return one_line_error(exc)
    found = LIST_GOT_SCALAR.match(cause.msg or "")
    if found is None:
        return one_line_error(exc)
    value = getattr(cause, "value", None)
    return (
        f"error: {cause.full_key}: takes a list, got the {found[1]} {value!r}; write a list in "
        f"brackets: {cause.full_key}=[{value}]"
    )


def _override_value(value: Any, key: str) -> str:
    """``value`` in Hydra's override grammar, so that it parses back to itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):  # numpy's too (its repr is np.int64(3))
        return repr(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))  # 1e-06, inf and nan parse back as floats
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes, Mapping, Sequence)):
        return _override_value(value.tolist(), key)  # numpy's bool_ and arrays, a tensor
    if isinstance(value, os.PathLike):  # a TrainResult's output_dir, final_hf, checkpoint
        return _override_value(os.fspath(value), key)
    if isinstance(value, str):
        # quoted: a backslash is literal except in a run before a quote or the end, halved
        return "'" + re.sub(r"(\\*)('|\Z)", _escape_before_quote, value) + "'"
    if isinstance(value, Mapping):
        items = (
            f"{_override_key(k, key)}:{_override_value(v, f'{key}.{k}')}" for k, v in value.items()
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return "[" + ",".join(_override_value(v, f"{key}[]") for v in value) + "]"
    raise TypeError(
        f"skyrl.compose: {key} is a {type(value).__name__}; a mapping's values are None, "
        "bool, int, float, str (numpy's too), paths, or lists and mappings of these"
    )


KEY_ESCAPED = re.compile(r"([\\()\[\]{}:=, \t])")
"""The characters a key in an override's mapping (``{key:value}``) writes after a backslash."""


def _override_key(k: object, key: str) -> str:
    """A key of the mapping ``key`` holds, in Hydra's override grammar: a string with the
    grammar's characters escaped (``x\\:y``; bare, ``{"x:y": 1}`` read back as ``{"x":
    "y:1"}``), anything else written as a value. A key that does not read back as itself (a
    string Hydra reads as a number, ``true`` or ``null``, or one it cannot read at all) is a
    ``ConfigError`` naming ``key``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    written = KEY_ESCAPED.sub(r"\\\1", k) if isinstance(k, str) else _override_value(k, key)
    try:
        (override,) = OverridesParser.create().parse_overrides([f"k={{{written}:0}}"])
        mapping = override.value()
    except OverrideParseException:
        problem = " (its grammar has no way to write it);"
    else:
        assert isinstance(mapping, dict)
        (read,) = mapping
        if read == k and type(read) is type(k):
            return written
        what = "None" if read is None else f"the {type(read).__name__} {read!r}"
        problem = f": it reads back as {what};"
    raise ConfigError(
        key, f"the mapping key {k!r} cannot be written in a Hydra override{problem} rename it"
    )


def _escape_before_quote(match: re.Match) -> str:
    backslashes, quote = match.groups()
    return backslashes * 2 + ("\\'" if quote else "")


def train(cfg: DictConfig, output_dir: str | Path | None = None) -> TrainResult:
    """Validate ``cfg``, run the pre-flight check (data files and rows, prompt lengths, model
    paths, env, rollout driver: ``skyrl.config.preflight``), save it resolved into the output
    dir, print the plan, and run the job (only check and plan it with
    ``trainer.dry_run=true``). ``output_dir`` defaults to ``trainer.output_dir``, else
    ``outputs/<date>/<time>``; a leading ``~`` is the home directory, as for
    ``trainer.resume`` and ``eval.checkpoint``, and a relative one is taken from the working
    directory now (``TrainResult``'s paths are absolute). A run that resumes the checkpoints
    in its output dir and fails or is interrupted before it saves one puts back the saved
    config they were trained with (``skyrl-eval`` reads their model from it)."""
    require_composed(cfg)
    if output_dir is not None:
        require_output_dir(output_dir, "skyrl.train")
    _show_warnings_again()
    typed = validate(cfg)
    # absolute: Ray's actors stay in the working directory Ray started in (a notebook's %cd)
    out = Path(output_dir or typed.trainer.output_dir or _timestamped_dir()).expanduser().absolute()
    resumes = check_run_dir(typed, out)
    checked = preflight(typed, for_run=not typed.trainer.dry_run)  # before any run dir
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "resolved_config.yaml"
    earlier = _config_of_checkpoints(saved)
    rows = [*checked.plan_rows(), ("output dir", str(out)), start_row(resumes)]
    if typed.trainer.dry_run and saved.exists():  # an earlier run's: skyrl-eval reads it
        rows.append(("saved config", f"{saved.name} kept as it is (dry run)"))
    else:
        OmegaConf.save(_config_to_save(cfg, typed), saved, resolve=True)
    print(format_plan(make_plan(typed)))
    for name, value in rows:
        print(f"  {name:<22}  {value}", flush=True)
    if typed.trainer.dry_run:
        return TrainResult(out)
    try:
        return _run(checked, out)
    except BaseException:
        _put_back_if_none_saved(saved, earlier)
        raise


_Checkpoints = dict[str, tuple[int, int]]
"""A run dir's checkpoint folders by name, each with its inode and modification time: a new
save, or one that replaced a folder, changes them."""


def _checkpoints_in(run_dir: Path) -> _Checkpoints:
    from skyrl.trainer.checkpoint import CheckpointManager

    root = run_dir / "checkpoints"
    dirs = [root / f"global_step_{step}" for step in CheckpointManager(root, 0).steps()]
    stats = {d.name: d.stat() for d in dirs}
    return {name: (st.st_ino, st.st_mtime_ns) for name, st in stats.items()}


def _config_of_checkpoints(saved: Path) -> tuple[bytes, _Checkpoints] | None:
    """The text of ``saved`` (``resolved_config.yaml``) and the checkpoints beside it, which it
    describes, before a run resuming them overwrites it; None without both."""
    try:
        checkpoints = _checkpoints_in(saved.parent)
        if checkpoints and saved.is_file():
            return saved.read_bytes(), checkpoints
    except OSError:  # unreadable: nothing to put back
        pass
    return None


def _put_back_if_none_saved(saved: Path, earlier: tuple[bytes, _Checkpoints] | None) -> None:
    """After a failed run, the config the dir's checkpoints were trained with back in ``saved``
    if the run saved none: a resume the workers refused (another ``model.path``, say) left the
    failed run's config there, and ``skyrl-eval`` of the checkpoints exported them with its
    model."""
    try:
        if earlier is not None and _checkpoints_in(saved.parent) == earlier[1]:
            saved.write_bytes(earlier[0])
    except OSError as exc:  # the run's own error is what the caller sees
        logger.warning("%s: could not put back the config of its checkpoints: %s", saved, exc)


def _show_warnings_again() -> None:
    """Let this run show every warning, also one whose text an earlier run in this process (a
    notebook's, a sweep job's) showed: Python shows a warning once per text and place until
    the warning filters change, and ``catch_warnings`` changes them on entry and on exit (back
    to the same filters)."""
    with warnings.catch_warnings():
        pass


def require_composed(cfg: object, function: str = "skyrl.train") -> None:
    """``cfg`` is a config ``compose`` made (typed by the schema): a dict, or a YAML loaded
    with ``OmegaConf.load``, has no schema to validate against. A saved
    ``resolved_config.yaml`` does not compose back either: it holds every key of the group
    options it was run with, and other options' schemas lack some of them. ``function``: the
    one refusing it (``skyrl.evaluate`` too)."""
    if isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is SkyRLConfig:
        return
    what = "a plain DictConfig" if isinstance(cfg, DictConfig) else f"a {type(cfg).__name__}"
    raise TypeError(
        f"{function} takes a config made by skyrl.compose(...), got {what}; to rerun a "
        "saved run, compose it again from its overrides: skyrl.compose(overrides) (a "
        "skyrl-train run dir keeps them in .hydra/overrides.yaml: "
        "skyrl.compose(OmegaConf.load('<run dir>/.hydra/overrides.yaml')))"
    )


def require_output_dir(output_dir: object, function: str) -> None:
    """``output_dir`` is a path (a str or ``os.PathLike``): ``Path(None)``'s ``TypeError`` did not
    name the argument. ``function``: the one refusing it (``skyrl.evaluate`` too)."""
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(
            f"{function} takes output_dir as a str or Path (the directory to write the results "
            f"in, e.g. 'outputs/mine'), got {output_dir!r}"
        )


def _config_to_save(cfg: DictConfig, typed: SkyRLConfig) -> DictConfig:
    """``resolved_config.yaml``: ``cfg`` with the values ``validate`` decided, and the model
    paths that name local directories made absolute, so ``skyrl-eval`` of the run finds them
    from any working directory (a hub id or ``skyrl-tiny`` stays: looked up where it runs)."""
    from skyrl.models.resolve import local_path

    saved = with_resolved_values(cfg, typed)
    for key, path in (
        ("model.path", typed.model.path),
        ("model.tokenizer_path", typed.model.tokenizer_path),
        ("trainer.critic_model_path", typed.trainer.critic_model_path),
    ):
        absolute = local_path(path) if path else None
        if absolute is not None:
            OmegaConf.update(saved, key, absolute)
    return saved


def _run(checked: Preflight, output_dir: Path) -> TrainResult:
    """Start Ray (if needed), run the loop, export, print the summary and write the plot (of
    the steps finished, too, when Ctrl-C or SIGTERM stops the run)."""
    from skyrl.trainer.trainer import RLTrainer

    cfg = checked.cfg  # model paths already resolved to local directories by the pre-flight
    _ray_keeping_sigterm_handler(cfg)
    # a trainer that fails to start stops what it started itself, before this try
    trainer = RLTrainer(cfg, output_dir, prompts=checked.prompts)
    try:
        try:
            trainer.train()
            final_hf = trainer.export() if cfg.trainer.export_hf else None
        finally:
            trainer.shutdown()
    except KeyboardInterrupt:
        _report_stopped(output_dir)
        raise
    history = _report(output_dir)
    return TrainResult(output_dir, history, final_hf)


def _report(output_dir: Path, heading: str | None = None) -> list[dict[str, float]]:
    """The run's whole record (a resumed run's steps before the resume too: the trainer's
    own history holds only the steps this process ran), plotted and summarised."""
    from skyrl.tracking.summary import format_summary, plot_history, read_history

    history = read_history(output_dir)
    if heading is not None and any(r["step"] > 0 for r in history):
        print(heading, flush=True)
    elif heading is not None:
        return history  # stopped before a step: nothing to show
    try:
        plot_history(history, output_dir / "metrics.png")
    except OSError as exc:  # a full disk at the end: the run's work is saved, say so and go on
        logger.warning("%s not written: %s", output_dir / "metrics.png", exc)
    print(format_summary(history, output_dir), flush=True)
    return history


def _report_stopped(output_dir: Path) -> None:
    """``_report`` of a run stopped by an interrupt; a record it cannot read (a line cut by
    the stop) leaves the interrupt's own line to say what happened."""
    from skyrl.tracking.jsonl import FILENAME

    if not (output_dir / FILENAME).is_file():  # stopped before the first step was logged
        return
    try:
        _report(output_dir, "stopped early; the steps it finished:")
    except (ConfigError, OSError) as exc:
        logger.warning("no summary of the steps finished: %s", exc)


def _ray_keeping_sigterm_handler(cfg, engines_only: bool = False) -> None:
    """``_ray_for_run``, then the caller's own SIGTERM handler back in place (``skyrl-train``'s
    and ``skyrl-eval``'s end in one line): ``ray.init`` replaces it with Ray's ``sys.exit``
    behind a C++ handler that prints a stack banner. A default handler (a notebook's) is left
    to Ray's."""
    import signal
    import threading

    handler = signal.getsignal(signal.SIGTERM)
    _ray_for_run(cfg, engines_only)
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


_started_ray_address: str | None = None
"""The address of the local Ray that ``start_ray`` started in this process, while it is up:
that one skyrl may restart bigger; any other Ray is the caller's."""


def start_ray(num_cpus: int | None = None) -> None:
    """Connect to ``RAY_ADDRESS`` (a running cluster, used as it is) or start a local Ray
    with ``num_cpus`` logical CPUs (None: the cores); nothing when Ray is already up."""
    global _started_ray_address
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        return
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    _started_ray_address = ray.get_runtime_context().gcs_address


def _ray_for_run(cfg, engines_only: bool = False) -> None:
    """Ray with room for the run's actors (``engines_only``: the engine actors alone, an eval's:
    ``ray_for_engines``). One process may run several: the basic launcher runs a sweep's jobs
    one after another in it, a notebook calls ``skyrl.train`` again, and a later run may
    reserve more CPUs than Ray has (its placement groups would wait 120 s and fail). A local
    Ray that ``start_ray`` started is then restarted sized for this run; a Ray the caller
    started is theirs: too small, it is a ``ConfigError``. A cluster at ``RAY_ADDRESS`` is used
    as it is (it may grow). The GPUs the actors ask for must be in a local Ray, whoever started
    it (``_check_gpus``)."""
    import ray

    needed = math.ceil(sum(_reserved_cpus(cfg, engines_only).values()))
    if ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):
        have = ray.cluster_resources().get("CPU", 0.0)
        if have < needed:
            if ray.get_runtime_context().gcs_address != _started_ray_address:
                key = "generator.num_engines" if engines_only else "trainer.dp_size"
                raise ConfigError(key, _too_small_message(cfg, needed, have, engines_only))
            ray.shutdown()
    start_ray(_logical_cpus(cfg, engines_only))  # nothing when Ray is up
    if not os.environ.get("RAY_ADDRESS"):
        _check_gpus(cfg, engines_only)


def _check_gpus(cfg, engines_only: bool) -> None:
    """The GPUs the run's actors ask for (``_reserved_cpus``' groups: the workers'
    ``trainer.num_gpus_per_worker``, the engines' ``generator.num_gpus_per_engine``) are no more
    than the local Ray has (its machine's, or what its caller gave it): Ray never placed an
    engine actor asking for a GPU it lacked, and the eval (or run) waited for its replies
    forever. A sum: fractions of one GPU each are not packed here."""
    import ray

    t, g = cfg.trainer, cfg.generator
    workers = [group for group in _reserved_cpus(cfg, engines_only) if group != "engines"]
    asked = {group: t.dp_size * t.num_gpus_per_worker for group in workers}
    if g.engines_in_actors:
        asked["engines"] = g.num_engines * g.num_gpus_per_engine
    needed = sum(asked.values())
    have = ray.cluster_resources().get("GPU", 0.0) if needed else 0.0
    if needed <= have:
        return
    parts, lower = [], []
    groups = [group for group in workers if asked[group]]
    if groups:
        names = groups[0] if len(groups) == 1 else f"{', '.join(groups[:-1])} and {groups[-1]}"
        parts.append(
            f"trainer.dp_size={t.dp_size} x trainer.num_gpus_per_worker="
            f"{t.num_gpus_per_worker:g} for the {names}"
        )
        lower.append("trainer.dp_size or trainer.num_gpus_per_worker")
    if asked.get("engines"):
        parts.append(
            f"generator.num_engines={g.num_engines} x generator.num_gpus_per_engine="
            f"{g.num_gpus_per_engine:g} for the engine{'s' if g.num_engines > 1 else ''}"
        )
        lower.insert(
            0, "generator.num_engines or generator.num_gpus_per_engine (0 runs the engines on CPUs)"
        )
    key = "generator.num_gpus_per_engine" if asked.get("engines") else "trainer.num_gpus_per_worker"
    raise ConfigError(
        key,
        f"{'its engines ask' if engines_only else 'the run asks'} for {needed:g} "
        f"GPU{'' if needed == 1 else 's'} "
        f"({' + '.join(parts)}), but the local Ray has {have:g}: lower {', or '.join(lower)}",
    )


def ray_for_engines(cfg) -> None:
    """Ray with room for the engine actors of ``cfg`` (``generator.engines_in_actors``) and
    nothing else, by ``_ray_for_run``'s rules: ``skyrl-eval``'s and ``skyrl-serve``'s, which
    start no worker. Ray started with the cores alone placed two engine actors of 1 CPU on 2
    cores; the eval waited for a third one's replies forever. The caller's SIGTERM handler is
    kept (``_ray_keeping_sigterm_handler``): under Ray's, a SIGTERM aborted the eval (SIGABRT)
    with a stack banner, and Ray's agents outlived it."""
    _ray_keeping_sigterm_handler(cfg, engines_only=True)


def _reserved_cpus(cfg, engines_only: bool = False) -> dict[str, float]:
    """Ray CPUs the run's actors reserve: each worker group that has its own bundles
    (policy, a reference not colocated with it, critic; none for ``engines_only``) and the
    engine actors."""
    from skyrl.trainer.plan import has_reference_workers

    t, a, g = cfg.trainer, cfg.algorithm, cfg.generator
    groups = [] if engines_only else ["policy"]
    if not engines_only and has_reference_workers(cfg) and not t.colocate_policy_ref:
        groups.append("reference")
    if not engines_only and a.uses_critic:
        groups.append("critic")
    reserved = {group: t.dp_size * t.num_cpus_per_worker for group in groups}
    if g.engines_in_actors:
        reserved["engines"] = g.num_engines * (g.num_cpus_per_engine or 1)
    return reserved


def _too_small_message(cfg, needed: int, have: float, engines_only: bool = False) -> str:
    t, g = cfg.trainer, cfg.generator
    reserved = _reserved_cpus(cfg, engines_only)
    parts, lower = [], "generator.num_engines or generator.num_cpus_per_engine"
    groups = [group for group in reserved if group != "engines"]
    if groups:
        names = groups[0] if len(groups) == 1 else f"{', '.join(groups[:-1])} and {groups[-1]}"
        parts.append(
            f"trainer.dp_size={t.dp_size} x trainer.num_cpus_per_worker="
            f"{t.num_cpus_per_worker:g} for the {names}"
        )
        lower = "trainer.dp_size or trainer.num_cpus_per_worker"
    if "engines" in reserved:
        parts.append(
            f"generator.num_engines={g.num_engines} x {g.num_cpus_per_engine or 1:g} "
            "for the engines"
        )
    return (
        f"{'its engines reserve' if engines_only else 'the run reserves'} {needed} Ray CPUs "
        f"({' + '.join(parts)}), but the Ray this process is connected to, started outside "
        f"skyrl, has {have:g}: start it with more CPUs, or lower {lower}"
    )


def _logical_cpus(cfg, engines_only: bool = False) -> int:
    """Ray CPUs to start a local Ray with: every worker bundle, the engine actors and the
    driver (logical: may exceed the cores)."""
    reserved = sum(_reserved_cpus(cfg, engines_only).values())
    return max(os.cpu_count() or 1, math.ceil(reserved) + 1)


def _timestamped_dir() -> Path:
    import time

    return Path("outputs") / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
