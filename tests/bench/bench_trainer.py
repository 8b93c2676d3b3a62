"""Per-phase time of the main job's step and the framework overhead share.

Run: ``python tests/bench/bench_trainer.py [RUN_DIR]``. With a run dir, reads its
``metrics.jsonl``; without, runs the default job (``skyrl-train``, SmolLM2-135M-Instruct,
vLLM, 2 DeepSpeed ranks) for 4 steps without eval or checkpoints (about 5 minutes here) and
reads that. Step 1 is left out (warm-up). Overhead = the share of a step that is neither
generation nor the workers' forward / backward / optimizer compute (``timing/overhead_frac``,
measured inside the workers, so Ray transfers, staging, advantages and sync count as overhead).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from skyrl.tracking import read_history

PHASES = ("generate", "forward", "train", "sync", "checkpoint", "eval")


def run_default_job(out: Path) -> Path:
    cmd = [
        str(Path(sys.executable).parent / "skyrl-train"), f"hydra.run.dir={out}",
        "trainer.total_steps=4", "trainer.eval_before_train=false", "trainer.eval_interval=0",
        "data.num_eval_prompts=0", "trainer.export_hf=false", "trainer.ckpt_interval=1000",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    run_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else run_default_job(Path(tempfile.mkdtemp()))
    steps = [r for r in read_history(run_dir) if r["step"] > 1]
    if not steps:
        raise SystemExit(f"{run_dir}: no steps after the first in metrics.jsonl")
    step_s = sum(r["timing/step_s"] for r in steps) / len(steps)
    print(f"run: {run_dir} ({len(steps)} steps after the first)")
    print(f"{'phase':<12} {'mean s':>8} {'share':>7}")
    for phase in PHASES:
        values = [r.get(f"timing/{phase}_s", 0.0) for r in steps]
        mean = sum(values) / len(values)
        print(f"{phase:<12} {mean:8.1f} {mean / step_s:7.1%}")
    print(f"{'step':<12} {step_s:8.1f}")
    overhead = sum(r["timing/overhead_frac"] for r in steps) / len(steps)
    print(f"framework overhead (not generate / forward / backward / optimizer): {overhead:.1%}")


if __name__ == "__main__":
    main()
