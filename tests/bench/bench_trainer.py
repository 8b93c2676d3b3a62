"""Per-phase time of the main job's step and the framework overhead share.

Run: ``python tests/bench/bench_trainer.py [RUN_DIR]``. With a run dir, reads its
``metrics.jsonl``; without, runs the default job (``skyrl-train``, SmolLM2-135M-Instruct,
vLLM, the config's ``trainer.dp_size`` DeepSpeed ranks) for 4 steps without eval (about 5
minutes here) in a temporary folder, reads that and deletes it. Step 1 is left out (warm-up).

The trainer always checkpoints the last step (~4 s here, against ~6 s steps), and a run with
eval evaluates every ``eval_interval`` steps, so each step's checkpoint and eval seconds are
left out of its time (as ``bench_trl.py`` does): the table shows them, but as seconds a step
on average, not as shares of the step. Overhead = the share of that time that is neither
generation nor the workers' forward / backward / optimizer compute (from
``timing/overhead_frac``, measured inside the workers, so Ray transfers, staging, advantages
and sync count as overhead).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from skyrl.tracking import read_history

PHASES = ("generate", "forward", "train", "sync")
"""Phases shown as shares of the step."""
LEFT_OUT = ("checkpoint", "eval")
"""Phases left out of the step's time and its overhead share."""


def run_default_job(out: Path) -> Path:
    cmd = [
        str(Path(sys.executable).parent / "skyrl-train"), f"hydra.run.dir={out}",
        "trainer.total_steps=4", "trainer.eval_before_train=false", "trainer.eval_interval=0",
        "data.num_eval_prompts=0", "trainer.export_hf=false", "trainer.ckpt_interval=1000",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def steady_step(row: dict[str, float]) -> tuple[float, float]:
    """One step's seconds without its checkpoint and eval, and its overhead share of those.

    The trainer logs ``overhead_frac = 1 - compute / step_s``, where compute is generation,
    eval and the workers' compute (``skyrl.trainer.trainer``); so compute is
    ``(1 - overhead_frac) x step_s``, less the eval seconds here.
    """
    step_s = row["timing/step_s"]
    eval_s = row.get("timing/eval_s", 0.0)
    compute_s = (1.0 - row["timing/overhead_frac"]) * step_s - eval_s
    steady_s = step_s - eval_s - row.get("timing/checkpoint_s", 0.0)
    return steady_s, max(0.0, 1.0 - compute_s / steady_s) if steady_s > 0 else 0.0


def figures(history: list[dict[str, float]]) -> dict[str, float]:
    """Means over the steps after the first: each phase's seconds (``PHASES`` and
    ``LEFT_OUT``), the step's seconds without checkpoint and eval (``step``) and its overhead
    share (``overhead``, from ``steady_step``)."""
    steps = [r for r in history if r["step"] > 1]
    if not steps:
        raise ValueError("no steps after the first in metrics.jsonl")
    out = {
        phase: sum(r.get(f"timing/{phase}_s", 0.0) for r in steps) / len(steps)
        for phase in PHASES + LEFT_OUT
    }
    steady = [steady_step(r) for r in steps]
    out["step"] = sum(s for s, _ in steady) / len(steps)
    out["overhead"] = sum(o for _, o in steady) / len(steps)
    out["steps"] = len(steps)
    return out


def report(run_dir: Path) -> None:
    try:
        fig = figures(read_history(run_dir))
    except ValueError as exc:
        raise SystemExit(f"{run_dir}: {exc}") from None
    step_s = fig["step"]
    print(f"run: {run_dir} ({fig['steps']:.0f} steps after the first)")
    print(f"{'phase':<12} {'mean s':>8} {'share':>7}")
    for phase in PHASES:
        print(f"{phase:<12} {fig[phase]:8.1f} {fig[phase] / step_s:7.1%}")
    print(f"{'step':<12} {step_s:8.1f}   (without checkpoint and eval)")
    for phase in LEFT_OUT:
        print(f"{phase:<12} {fig[phase]:8.1f}   (left out of the step)")
    print(
        f"framework overhead (not generate / forward / backward / optimizer): {fig['overhead']:.1%}"
    )


def main() -> None:
    if len(sys.argv) > 1:
        report(Path(sys.argv[1]))
        return
    with tempfile.TemporaryDirectory() as out:  # its checkpoints are ~1.6 GB
        report(run_default_job(Path(out)))


if __name__ == "__main__":
    main()
