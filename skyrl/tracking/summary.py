"""After a run: read ``metrics.jsonl`` back, plot it, and write the end-of-run summary.

The history is a list of records ``{"step": N, name: value, ...}`` as the jsonl sink writes
them; a record at step 0 (eval before training) is allowed and is not a training step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from statistics import fmean
from typing import Any

from skyrl.tracking import metric_names as names
from skyrl.tracking.jsonl import FILENAME, read_records

FIRST_LAST_STEPS = 5
"""The summary compares the mean training reward of the first and last this-many steps
(``first_last_windows``: fewer in a run of under twice as many)."""


def read_history(output_dir: Path | str) -> list[dict[str, float]]:
    """The records of ``<output_dir>/metrics.jsonl``, with ``null`` read back as NaN."""
    records = read_records(Path(output_dir) / FILENAME)
    return [{k: math.nan if v is None else v for k, v in r.items()} for r in records]


def series(history: Iterable[dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    """Steps and finite values of ``key``, over the records that have it."""
    points = [(r["step"], r[key]) for r in history if key in r and math.isfinite(r[key])]
    return [int(step) for step, _ in points], [value for _, value in points]


def plot_history(history: list[dict[str, float]], path: Path | str) -> Path:
    """A PNG with three panels over steps: training reward, eval pass@1 (one line per eval
    key), response length; and a fourth, the staleness trained on (mean and max), in an
    asynchronous run. A panel whose metric was never logged says "no data"."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend stays untouched

    asynchronous = any(names.ASYNC_STALENESS_MAX in r for r in history)
    panels = 4 if asynchronous else 3
    fig = Figure(figsize=(13 + 4 * (panels - 3), 3.6), layout="constrained")
    axes = fig.subplots(1, panels)
    _plot_panel(axes[0], "training reward", history, [names.REWARD])
    eval_keys = names.eval_pass_at_1_keys({k for r in history for k in r})
    _plot_panel(axes[1], "eval pass@1", history, eval_keys)
    _plot_panel(axes[2], "response length (tokens)", history, [names.RESPONSE_LENGTH])
    if asynchronous:
        staleness = [names.ASYNC_STALENESS_MEAN, names.ASYNC_STALENESS_MAX]
        _plot_panel(axes[3], "staleness (policy versions)", history, staleness)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _plot_panel(ax: Any, title: str, history: list[dict[str, float]], keys: list[str]) -> None:
    """One line with markers per key, or "no data" when none of them has a value."""
    ax.set_title(title)
    ax.set_xlabel("step")
    plotted = 0
    for key in keys:
        steps, values = series(history, key)
        if steps:
            ax.plot(steps, values, marker="o", markersize=3, label=key)
            plotted += 1
    if not plotted:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    elif len(keys) > 1:
        ax.legend(fontsize="small")


def format_summary(
    history: list[dict[str, float]], output_dir: Path | str, extra: dict[str, Any] | None = None
) -> str:
    """The end-of-run text: steps, reward first vs last steps, eval first vs last, time per
    phase with its share of step time, framework overhead, where the outputs are, then
    ``extra`` as ``key: value`` lines."""
    train = [r for r in history if r["step"] > 0]
    lines = [f"steps run: {len(train)}"]
    lines += _reward_lines(train)
    lines += _eval_lines(history)
    lines += _timing_lines(train)
    lines += _output_lines(Path(output_dir))
    lines += [f"{key}: {_format_value(value)}" for key, value in (extra or {}).items()]
    return "\n".join(lines)


def _reward_lines(train: list[dict[str, float]]) -> list[str]:
    """Mean training reward of the first vs the last ``FIRST_LAST_STEPS`` steps, fewer in a
    run of under twice as many, so the two never share a step (``first_last_windows``); the
    one value of a run with a single rewarded step."""
    steps, rewards = series(train, names.REWARD)
    if not rewards:
        return []
    if len(rewards) == 1:
        only = "the only step" if len(train) == 1 else "the only step with a reward"
        return [f"training reward: {rewards[0]:.3f} (step {steps[0]}, {only})"]
    first, last = first_last_windows(rewards)
    steps_word = "step" if len(first) == 1 else f"{len(first)} steps"
    return [
        f"training reward: first {steps_word} {fmean(first):.3f} -> last {steps_word} "
        f"{fmean(last):.3f}"
    ]


def first_last_windows(values: list[float]) -> tuple[list[float], list[float]]:
    """The first and the last ``FIRST_LAST_STEPS`` values, fewer when there are under twice
    as many, so the two never share one: 4 values give the first 2 and the last 2, 5 the
    first 2 and the last 2 (the middle one in neither). A single value is both windows (there
    is nothing to compare it with); none gives two empty ones."""
    if len(values) == 1:
        return values, values
    n = min(FIRST_LAST_STEPS, len(values) // 2)
    return values[:n], values[len(values) - n :]


def _eval_lines(history: list[dict[str, float]]) -> list[str]:
    """First vs last value of each eval pass@1 key, with their steps; the one value of a key
    evaluated once."""
    lines = []
    for key in names.eval_pass_at_1_keys({k for r in history for k in r}):
        steps, values = series(history, key)
        if len(steps) == 1:
            lines.append(f"{key}: {values[0]:.3f} (step {steps[0]}, the only eval)")
        elif steps:
            lines.append(
                f"{key}: {values[0]:.3f} (step {steps[0]}) -> {values[-1]:.3f} (step {steps[-1]})"
            )
    return lines


def _timing_lines(train: list[dict[str, float]]) -> list[str]:
    """Mean step time, each phase's mean and share of the total step time, and overhead.

    All over the timed steps, those with a finite ``timing/step_s``: a step without one (NaN,
    or not logged) adds none of its phases either, or they would be shares of a total that
    lacks them (over 100%). Shares are totals over the timed steps (a phase logged on only
    some steps, like eval, counts 0 on the others); a phase's mean is over the steps that
    logged it.
    """
    timed = [r for r in train if math.isfinite(r.get(names.STEP_TIME, math.nan))]
    if not timed:
        return []
    step_times = [r[names.STEP_TIME] for r in timed]
    total_step_s = sum(step_times)
    lines = [f"time per step: {fmean(step_times):.2f}s mean, {total_step_s:.1f}s total"]
    for key in _phase_keys(timed):
        _, values = series(timed, key)
        if values:
            share = sum(values) / total_step_s if total_step_s > 0 else math.nan
            lines.append(
                f"  {key[len('timing/') : -2]}: {fmean(values):.2f}s mean, {share:.0%} of step time"
            )
    overhead = _overhead_frac(timed, total_step_s)
    if overhead is not None:
        lines.append(f"framework overhead: {overhead:.0%} of step time ({_overhead_is(timed)})")
    return lines


def _overhead_is(train: list[dict[str, float]]) -> str:
    """What the overhead line counts (``_overhead_frac``): the logged share is time inside
    the phases above (their shares already add up to the step), the fallback time outside."""
    if any(names.OVERHEAD_FRAC in r for r in train):
        return "within the phases above: all but generation, eval and the workers' compute"
    return "outside generate, forward, train, sync and eval"


def _phase_keys(train: list[dict[str, float]]) -> list[str]:
    """The logged ``timing/*_s`` keys except step time: the loop's phases in loop order, then
    any others alphabetically."""
    logged = {k for r in train for k in r if k.startswith("timing/") and k.endswith("_s")}
    known = [key for key in names.PHASE_TIMES.values() if key in logged]
    return known + sorted(logged - set(known) - {names.STEP_TIME})


def _overhead_frac(train: list[dict[str, float]], total_step_s: float) -> float | None:
    """The logged ``timing/overhead_frac`` as a share of the total step time, like the phase
    lines: sum(frac_i * step_s_i) / sum(step_s_i) over the steps that logged both (a plain
    mean would let a short step weigh as much as a long one). Without it, 1 - (sum of the
    generate, forward, train, sync, eval phases) / (sum of step times): the checkpoint counts
    as overhead, as in the logged share; None without any phase."""
    if any(names.OVERHEAD_FRAC in r for r in train):
        return _time_weighted(train, names.OVERHEAD_FRAC)
    keys = [key for key in names.PHASE_TIMES.values() if any(key in r for r in train)]
    if not keys or total_step_s <= 0:
        return None
    return 1 - sum(sum(series(train, key)[1]) for key in keys) / total_step_s


def _time_weighted(train: list[dict[str, float]], key: str) -> float | None:
    """Mean of ``key`` weighted by each step's ``timing/step_s``, over the steps with finite
    values of both; None when their step time adds up to nothing."""
    pairs = [
        (r[key], r[names.STEP_TIME])
        for r in train
        if key in r and names.STEP_TIME in r
        and math.isfinite(r[key]) and math.isfinite(r[names.STEP_TIME])
    ]  # fmt: skip
    total_s = sum(step_s for _, step_s in pairs)
    return sum(v * step_s for v, step_s in pairs) / total_s if total_s > 0 else None


def _output_lines(output_dir: Path) -> list[str]:
    """Where the run's files are, for those that exist."""
    candidates = [
        ("metrics", output_dir / FILENAME),
        *[("plot", png) for png in sorted(output_dir.glob("*.png"))],
        ("checkpoints", output_dir / "checkpoints"),
        ("final model", output_dir / "final_hf"),
        ("tensorboard", output_dir / "tensorboard"),
        ("wandb", output_dir / "wandb"),
        ("mlflow", output_dir / "mlruns"),
    ]
    found = [f"  {label}: {path}" for label, path in candidates if path.exists()]
    return ["outputs:", *found] if found else []


def _format_value(value: Any) -> str:
    """Floats to 4 significant digits; anything else as ``str``."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
