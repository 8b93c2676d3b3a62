"""Console sink: a tqdm progress bar over training steps plus one compact line per step.

The per-step line always goes to stdout (``tqdm.write`` keeps it above the bar); the bar
itself is drawn only when stdout is a terminal, so CI logs and captured subprocess output
get the lines without redraw noise. A stdout whose reader has gone (``skyrl-train ... | head``)
ends the lines, not the run: the sink says so once on stderr and prints nothing more.
"""

from __future__ import annotations

import math
import os
import sys
from statistics import fmean

from tqdm import tqdm

from skyrl.tracking import metric_names as names
from skyrl.tracking.sink import RunInfo


class ConsoleSink:
    """Progress bar (reward and step time as postfix) and a ``step N/T | ...`` line per step."""

    def __init__(self, run: RunInfo) -> None:
        self.total_steps = run.total_steps
        self.bar = tqdm(
            total=run.total_steps,
            initial=run.start_step,
            unit="step",
            desc="train",
            file=sys.stdout,
            dynamic_ncols=True,
            disable=not sys.stdout.isatty(),
        )
        self.stdout_closed = False
        """stdout's reader went away: nothing more is printed."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Print the step's line and move the bar to ``step``; nothing once stdout is closed."""
        if self.stdout_closed:
            return
        try:
            tqdm.write(format_step_line(step, self.total_steps, metrics), file=sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:
            self._stop_printing()
            return
        postfix = {"reward": metrics.get(names.REWARD), "step_s": metrics.get(names.STEP_TIME)}
        self.bar.set_postfix(
            {k: f"{v:.3g}" for k, v in postfix.items() if v is not None}, refresh=False
        )
        self.bar.update(max(0, step - self.bar.n))

    def close(self, failed: bool = False) -> None:
        """Leave the finished bar on screen."""
        self.bar.close()

    def _stop_printing(self) -> None:
        """stdout's reader exited: print no more lines and say so once on stderr. The real
        stdout is pointed at ``os.devnull``, as Python's docs advise for ``BrokenPipeError``,
        so later prints (the end-of-run summary) and the flush at exit do not fail on it."""
        self.stdout_closed = True
        if sys.__stdout__ is not None and sys.stdout is sys.__stdout__:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        try:
            print(
                "console: stdout was closed (its reader exited): no more step lines; "
                "metrics.jsonl still records every step",
                file=sys.stderr,
                flush=True,
            )
        except OSError:  # stderr went with it (``2>&1 | head``)
            pass


COLUMNS = {
    "reward": (names.REWARD, ".3f"),
    "len": (names.RESPONSE_LENGTH, ".1f"),
    "kl": (names.KL, ".2g"),
    "loss": (names.POLICY_LOSS, ".3g"),
    "gnorm": (names.GRAD_NORM, ".3g"),
}
"""The line's single-metric columns: label -> (metric name, format). ``eval`` (after
``reward``) is computed from the ``eval/...pass@1`` keys; the timing part reads
``names.STEP_TIME`` and ``PHASE_SHARES``."""

PHASE_SHARES = {
    "gen": names.PHASE_TIMES["gen"],
    "fwd": names.PHASE_TIMES["fwd"],
    "train": names.PHASE_TIMES["train"],
    "sync": names.PHASE_TIMES["sync"],
    "ckpt": names.CHECKPOINT_TIME,
    "eval": names.PHASE_TIMES["eval"],
}
"""The timing part's phases in loop order, by label: ``names.PHASE_TIMES`` and the
checkpoint, saved between sync and eval on the steps that save one."""


def format_step_line(step: int, total_steps: int, metrics: dict[str, float]) -> str:
    """``step 3/20 | reward 0.312 | eval 0.250 | len 41.2 | kl 0.0012 | loss 0.031 | gnorm 0.84
    | 12.3s (gen 40% fwd 12% train 45%)``, skipping whatever the step did not log.

    ``eval`` is ``eval/pass@1`` or, when eval sets are logged separately, the mean of their
    ``eval/...pass@1`` keys; ``kl`` is ``policy/kl`` (only with ``algorithm.use_kl_loss``),
    ``loss`` the step's mean policy loss, ``gnorm`` its mean grad norm.
    """
    eval_keys = _line_eval_keys(metrics)
    columns = [(label, metrics.get(key), spec) for label, (key, spec) in COLUMNS.items()]
    if eval_keys:  # right after reward
        columns.insert(1, ("eval", fmean(metrics[k] for k in eval_keys), ".3f"))
    parts = [f"step {step}/{total_steps}"]
    parts += [f"{label} {value:{spec}}" for label, value, spec in columns if value is not None]
    if names.STEP_TIME in metrics:
        parts.append(_format_timing(metrics))
    return " | ".join(parts)


def _line_eval_keys(metrics: dict[str, float]) -> list[str]:
    """``eval/pass@1`` alone when present, else every ``eval/...pass@1`` key."""
    if names.EVAL_PASS_AT_1 in metrics:
        return [names.EVAL_PASS_AT_1]
    return names.eval_pass_at_1_keys(metrics)


def _format_timing(metrics: dict[str, float]) -> str:
    """``12.3s (gen 40% fwd 12% train 45%)``: step time and each logged phase's share of it
    (``PHASE_SHARES``)."""
    step_s = metrics[names.STEP_TIME]
    text = f"{step_s:.1f}s"
    if not (math.isfinite(step_s) and step_s > 0):
        return text
    shares = [
        f"{label} {100 * metrics[key] / step_s:.0f}%"
        for label, key in PHASE_SHARES.items()
        if key in metrics
    ]
    return f"{text} ({' '.join(shares)})" if shares else text
