"""Sweep summaries: one table and one picture comparing the jobs of a Hydra multirun.

``SweepSummary`` is a Hydra callback (``+hydra/callbacks=sweep_summary``). It writes
``<sweep dir>/summary.csv`` (one row per job: job number, its overrides as columns, final
metrics, status, output dir) and ``<sweep dir>/summary.png`` (final metrics per job, and the
training-reward curves).

The summary is rebuilt from the job directories on disk, not from memory, so it is the same
with every launcher (basic, joblib, ray: their jobs run in other processes). It is rewritten
after EVERY job, not only at the end: Hydra's basic sweeper re-raises a failed job's error
after its batch and never calls ``on_multirun_end``, and the table must still be there, with
that job marked ``failed``. Each job leaves ``job_return.json`` (status, objective, error) in
its directory; a job directory without one is ``running`` until the multirun ends, then
``failed`` (its process died before Hydra could record the end, or Ctrl-C stopped it). A
sweep that ends before its last job (Ctrl-C, or a failed job that ends it) gets its final
summary as the process exits: Hydra calls ``on_multirun_end`` only after the last job, and
no ``on_job_end`` for a job a ``KeyboardInterrupt`` stopped. Each job also leaves
``job_output_dir.txt`` at its start: where its trainer writes (a ``skyrl-eval`` job: its job
dir, where it writes whatever ``trainer.output_dir`` says), resolved while the job's Hydra
config is current (Hydra saves ``.hydra/config.yaml`` unresolved, and ``${hydra:job.num}``
re-resolved later would name another job, or fail once the multirun is over); a job that sets
``eval.output_file`` (a ``skyrl-eval`` sweep's ``r_${hydra:job.num}.json``) leaves that file's
path resolved the same way in ``job_eval_file.txt``.
"""

from __future__ import annotations

import atexit
import csv
import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from statistics import fmean
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from skyrl.config.errors import ConfigError
from skyrl.tracking import metric_names as names
from skyrl.tracking.summary import FIRST_LAST_STEPS, first_last_windows, read_history, series

JOB_RETURN = "job_return.json"
"""Per job directory: ``{"status": "ok" | "failed", "objective": float | null, "error": str}``
(a non-finite objective, a dry run's placeholder for a search sweeper, is null)."""
JOB_OUTPUT_DIR = "job_output_dir.txt"
"""Per job directory: the absolute directory the job's trainer writes to (its metrics.jsonl);
a ``skyrl-eval`` job's own dir."""
WRITES_IN_JOB_DIR = "skyrl_writes_in_job_dir"
"""Set (True) on a Hydra task function that writes in its job's Hydra dir whatever
``trainer.output_dir`` says (``skyrl-eval``'s: ``writes_in_job_dir``): its job's
``job_output_dir.txt`` names the job dir."""
JOB_EVAL_FILE = "job_eval_file.txt"
"""Per job directory that sets ``eval.output_file``: that file, absolute (``skyrl-eval``'s
results; without it they are ``eval_results.json`` in the job's output dir)."""
METRIC_COLUMNS = ("steps", "reward_first5_mean", "reward_last5_mean", names.EVAL_PASS_AT_1)
"""Final metrics per job, after the override columns: training steps; the mean training reward
of the first and of the last 5 rewarded steps, fewer in a job of under 10 so the two never
share a step (as the end-of-run summary line, ``first_last_windows``: 4 steps, the first 2 and
the last 2; 5 steps, the first 2 and the last 2, the middle one in neither; a job with a single
rewarded step shows its reward in both, and one without any leaves both empty); the last
``eval/pass@1`` (empty if never evaluated)."""


class SweepSummary(Callback):
    """Hydra callback: record each job's output dir and end, then rewrite the sweep summary."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Have the final summary written at exit, unless ``on_multirun_end`` writes it."""
        self._sweep_dir = Path(config.hydra.sweep.dir).absolute()
        atexit.register(self._summarize_at_exit)

    def _summarize_at_exit(self) -> None:
        """The final summary of a sweep that ended before its last job, if any job started."""
        if job_dirs(self._sweep_dir):
            write_summary(self._sweep_dir, finished=True)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the job's ``job_output_dir.txt`` (and ``job_eval_file.txt``) while its Hydra
        config is the current one."""
        from hydra.types import RunMode

        if config.hydra.mode != RunMode.MULTIRUN:
            return
        in_job_dir = getattr(kwargs.get("task_function"), WRITES_IN_JOB_DIR, False)
        write_job_output_dir(Path(config.hydra.runtime.output_dir), config, in_job_dir)
        write_job_eval_file(Path(config.hydra.runtime.output_dir), config)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """Write the job's ``job_return.json``, then the summary so far (others may run)."""
        from hydra.types import RunMode

        if config.hydra.mode != RunMode.MULTIRUN:
            return
        write_job_return(Path(config.hydra.runtime.output_dir), job_return)
        write_summary(Path(config.hydra.sweep.dir), finished=False)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """The final summary: a job that never recorded its end counts as failed."""
        atexit.unregister(self._summarize_at_exit)
        csv_path, png_path = write_summary(Path(config.hydra.sweep.dir), finished=True)
        print(f"sweep summary: {csv_path}\nsweep plot: {png_path}", flush=True)


def write_job_return(job_dir: Path, job_return: Any) -> Path:
    """``job_return.json`` from Hydra's ``JobReturn`` (status, float objective, error text)."""
    from hydra.core.utils import JobStatus
    from hydra.errors import CompactHydraException

    ok = job_return.status == JobStatus.COMPLETED
    value = job_return._return_value  # the property re-raises a failed job's exception
    number = ok and isinstance(value, int | float) and math.isfinite(value)
    compact = isinstance(value, CompactHydraException)  # already an ``error: <key>: ...`` line
    record = {
        "status": "ok" if ok else "failed",
        "objective": float(value) if number else None,  # a dry run's placeholder is no result
        "error": "" if ok else (str(value) if compact else f"{type(value).__name__}: {value}"),
    }
    path = job_dir / JOB_RETURN
    _write_atomic(path, json.dumps(record))
    return path


def write_job_output_dir(job_dir: Path, config: DictConfig, in_job_dir: bool = False) -> Path:
    """``job_output_dir.txt``: ``trainer.output_dir`` resolved now (absolute, as the job's
    trainer sees it) if the job sets it, else the job dir; the job dir for a job that writes
    there whatever ``trainer.output_dir`` says (``in_job_dir``: ``skyrl-eval``'s, which would
    else be summarized from the ``metrics.jsonl`` of the training run that dir may hold)."""
    configured = None if in_job_dir else OmegaConf.select(config, "trainer.output_dir")
    path = job_dir / JOB_OUTPUT_DIR
    written = os.path.abspath(os.path.expanduser(configured)) if configured else str(job_dir)
    _write_atomic(path, written)  # ~ expanded as ``skyrl.train`` expands it
    return path


def writes_in_job_dir(task: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """Mark a Hydra task function (under ``@hydra.main``) as writing in its job's Hydra dir
    whatever ``trainer.output_dir`` says (``WRITES_IN_JOB_DIR``)."""
    setattr(task, WRITES_IN_JOB_DIR, True)
    return task


def write_job_eval_file(job_dir: Path, config: DictConfig) -> Path | None:
    """``job_eval_file.txt``: ``eval.output_file`` resolved now (absolute, as ``skyrl-eval``
    takes it: ``~`` expanded, relative to the working directory) if the job sets it; None
    when it does not."""
    configured = OmegaConf.select(config, "eval.output_file")
    if not configured:
        return None
    path = job_dir / JOB_EVAL_FILE
    _write_atomic(path, os.path.abspath(os.path.expanduser(configured)))
    return path


def write_summary(sweep_dir: Path, finished: bool = True) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``summary.png`` for every job found under ``sweep_dir``."""
    rows = collect_jobs(sweep_dir, finished)
    csv_path = write_csv(rows, sweep_dir / "summary.csv")
    png_path = plot_summary(rows, sweep_dir / "summary.png")
    return csv_path, png_path


def collect_jobs(sweep_dir: Path, finished: bool = True) -> list[dict[str, Any]]:
    """One summary row per job directory under ``sweep_dir``, by job number. Every one is
    this sweep's: the precheck refuses a sweep dir that holds an earlier sweep's jobs."""
    rows = [summarize_job(d, finished) for d in job_dirs(sweep_dir)]
    return sorted(rows, key=lambda r: (r["job"], r["output_dir"]))


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories under ``sweep_dir`` (those holding ``.hydra/overrides.yaml``), in
    path order; none when it does not exist."""
    found = Path(sweep_dir).resolve().glob("**/.hydra/overrides.yaml")
    return sorted(p.parent.parent for p in found)


def summarize_job(job_dir: Path, finished: bool = True) -> dict[str, Any]:
    """Job number, overrides, final metrics, status and output dir of one job directory. A
    damaged ``metrics.jsonl`` leaves the job's metrics empty and its error says why; the
    other jobs' rows are written as ever."""
    hydra_dir = job_dir / ".hydra"
    output_dir = _output_dir(job_dir)
    status, error = _status(job_dir, finished)
    try:
        history = read_history(output_dir) if (output_dir / "metrics.jsonl").exists() else []
        history = history or _eval_history(_eval_file(job_dir))
    except ConfigError as exc:  # a line that is not a record (``read_records``)
        history, error = [], "; ".join(e for e in (error, exc.message) if e)
    return {
        "job": _job_number(hydra_dir),
        "overrides": parse_overrides(OmegaConf.load(hydra_dir / "overrides.yaml")),
        **final_metrics(history),
        "status": status,
        "error": error,
        "output_dir": str(output_dir),
        "history": history,
    }


def _eval_file(job_dir: Path) -> Path | None:
    """Where a ``skyrl-eval`` job wrote its results: the ``eval.output_file`` it recorded at its
    start, else ``eval_results.json`` in its Hydra job dir (``skyrl-eval`` writes there whatever
    ``trainer.output_dir`` says, an experiment's, say). None when the recorded file is older
    than the record: an earlier eval's, which this job (failed, or still running) did not
    replace."""
    from skyrl.eval_cli import RESULTS_FILE

    recorded = job_dir / JOB_EVAL_FILE
    if not recorded.is_file():
        return job_dir / RESULTS_FILE
    path = Path(recorded.read_text())
    if path.is_file() and path.stat().st_mtime_ns < recorded.stat().st_mtime_ns:
        return None
    return path


def _eval_history(path: Path | None) -> list[dict[str, float]]:
    """A ``skyrl-eval`` job's results file ``path`` as a history of one step-0 record (its
    metrics), as a training run's eval before training is logged; [] without the file. A file
    that is not JSON with a ``metrics`` object is a ``ConfigError`` naming it."""
    if path is None or not path.is_file():
        return []
    try:
        metrics = json.loads(path.read_text())["metrics"]
        return [{"step": 0, **{k: float(v) for k, v in dict(metrics).items()}}]
    except (ValueError, KeyError, TypeError) as exc:  # ValueError: not JSON, a value not a number
        raise ConfigError(
            "eval.output_file", f"{path} is not an eval results file ({exc})"
        ) from None


def parse_overrides(overrides: Iterable[object]) -> dict[str, str]:
    """``["algorithm=grpo", "+x.y=1"]`` -> ``{"algorithm": "grpo", "x.y": "1"}``."""
    parsed = {}
    for line in overrides:
        key, _, value = str(line).partition("=")
        parsed[key.lstrip("+~")] = value
    return parsed


def final_metrics(history: list[dict[str, float]]) -> dict[str, float]:
    """Training steps, mean training reward of the first / last 5 steps (fewer in a short
    job: ``METRIC_COLUMNS``), last eval pass@1; NaN for what the history lacks."""
    train = [r for r in history if r["step"] > 0]
    _, rewards = series(train, names.REWARD)
    _, pass_at_1 = series(history, names.EVAL_PASS_AT_1)
    first, last = first_last_windows(rewards)
    return {
        "steps": len(train),
        "reward_first5_mean": fmean(first) if first else math.nan,
        "reward_last5_mean": fmean(last) if last else math.nan,
        names.EVAL_PASS_AT_1: pass_at_1[-1] if pass_at_1 else math.nan,
    }


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """``job, <override keys in first-seen order>, <metrics>, status, error, output_dir``."""
    keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    header = ["job", *keys, *METRIC_COLUMNS, "status", "error", "output_dir"]
    lines = [header]
    for r in rows:
        metrics = [_format(r[c]) for c in METRIC_COLUMNS]
        overrides = [r["overrides"].get(k, "") for k in keys]
        lines.append([r["job"], *overrides, *metrics, r["status"], r["error"], r["output_dir"]])
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows(lines)
    os.replace(tmp, path)
    return path


def plot_summary(rows: list[dict[str, Any]], path: Path) -> Path:
    """Three panels: final eval pass@1 and last-5 training reward per job (bars), and each
    job's training-reward curve."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend stays untouched

    fig = Figure(figsize=(14, 4.2), layout="constrained")
    pass_ax, reward_ax, curve_ax = fig.subplots(1, 3)
    labels = job_labels(rows)
    _bars(pass_ax, "final eval pass@1", rows, labels, names.EVAL_PASS_AT_1)
    _bars(reward_ax, f"training reward, last {FIRST_LAST_STEPS} steps", rows, labels,
          "reward_last5_mean")  # fmt: skip
    _curves(curve_ax, rows, labels)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}{path.suffix}")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
    return path


def job_labels(rows: list[dict[str, Any]]) -> list[str]:
    """``#<job> key=value ...`` with only the overrides that differ between jobs."""
    keys = list(dict.fromkeys(k for r in rows for k in r["overrides"]))
    varying = [k for k in keys if len({r["overrides"].get(k) for r in rows}) > 1]
    return [
        " ".join([f"#{r['job']}", *(f"{k.split('.')[-1]}={r['overrides'].get(k, '')}"
                                    for k in varying)])
        for r in rows
    ]  # fmt: skip


def _bars(ax: Any, title: str, rows: list[dict[str, Any]], labels: list[str], key: str) -> None:
    """One bar per job with its value written at the end (a missing value draws no bar and
    says why: ``failed``, ``running`` or ``n/a``); failed jobs are grey."""
    values = [r[key] if math.isfinite(r[key]) else 0.0 for r in rows]
    colors = ["tab:blue" if r["status"] == "ok" else "lightgray" for r in rows]
    bars = ax.barh(range(len(rows)), values, color=colors)
    texts = [
        f"{r[key]:.3f}"
        if math.isfinite(r[key])
        else (r["status"] if r["status"] != "ok" else "n/a")
        for r in rows
    ]
    ax.bar_label(bars, labels=[f" {t}" for t in texts], fontsize="small")
    if not any(values):
        ax.set_xlim(0, 1)  # all zero or missing: keep a readable axis
    ax.set_yticks(range(len(rows)), labels, fontsize="small")
    ax.invert_yaxis()
    ax.set_title(title)


def _curves(ax: Any, rows: list[dict[str, Any]], labels: list[str]) -> None:
    """Training reward over steps, one line per job that logged it."""
    ax.set_title("training reward")
    ax.set_xlabel("step")
    plotted = 0
    for r, label in zip(rows, labels, strict=True):
        steps, values = series([h for h in r["history"] if h["step"] > 0], names.REWARD)
        if steps:
            ax.plot(steps, values, marker="o", markersize=3, label=label)
            plotted += 1
    if plotted:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _output_dir(job_dir: Path) -> Path:
    """Where the job's trainer wrote, as the job recorded it at its start. A job without that
    record (a sweep from before it existed): ``trainer.output_dir`` from its saved config if
    it set one that resolves outside the job, else the job dir."""
    recorded = job_dir / JOB_OUTPUT_DIR
    if recorded.exists():
        return Path(recorded.read_text())
    config_path = job_dir / ".hydra" / "config.yaml"
    if config_path.exists():
        try:
            configured = OmegaConf.select(OmegaConf.load(config_path), "trainer.output_dir")
        except OmegaConfBaseException:  # e.g. ``${hydra:job.num}`` with no job current
            configured = None
        if configured:
            return Path(configured).expanduser()
    return job_dir


def _job_number(hydra_dir: Path) -> int:
    """``hydra.job.num`` from the job's saved Hydra config (-1 if unreadable)."""
    try:
        return int(OmegaConf.load(hydra_dir / "hydra.yaml").hydra.job.num)
    except Exception:
        return -1


def _status(job_dir: Path, finished: bool) -> tuple[str, str]:
    """``(status, error)`` from ``job_return.json``; without it, running or (at the end) failed."""
    path = job_dir / JOB_RETURN
    if path.exists():
        record = json.loads(path.read_text())
        return record["status"], record.get("error", "")
    if finished:
        return "failed", "the job ended without recording a result (interrupted, killed or exited)"
    return "running", ""


def _format(value: Any) -> str:
    """Floats with 6 significant digits, NaN as empty; anything else as ``str``."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file, so a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
