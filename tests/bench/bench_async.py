"""Asynchronous training on this machine: the main job's model and task, the engine actor on
one core, one DeepSpeed rank on the other, ``trainer.max_staleness`` 0, 1, 2.

Run: ``python tests/bench/bench_async.py [--steps 6] [--prompts 4] [--rows 0,1,2,1p]
[--no-train] [--no-simulated] [--simulated-train-s 20] [--work-dir DIR]``.

1. Training rows (``skyrl-train`` subprocesses, the main job with
   ``generator.num_cpus_per_engine=1 trainer.dp_size=1 trainer.num_cpus_per_worker=1``, no eval, no checkpoint
   before the last step; ``--prompts`` per step, half of them per mini-batch, so two
   optimizer steps per step as in the main job): per row the mean over the timed steps (2 .. N-1: step 1
   starts the stream, step N saves the checkpoint) of tokens trained per second
   (``policy/loss_tokens`` / ``timing/step_s``), the step time, the share of it the
   engine had no request in flight and the trainer waited for its batch, the
   staleness observed, and the reward of the last 3 steps. ``1p`` = staleness 1
   with ``trainer.partial_rollouts=true``. At ``max_staleness=0`` (the synchronous
   loop) the engine is idle for everything but the generate phase and the trainer
   waits for all of it.
2. Simulated trainer: the same engine actor and rollout source, but "training" is a
   fixed sleep (``--simulated-train-s``), so the table shows how much generation the
   overlap buys when the trainer takes that long: generated tokens per second and
   the engine's idle share.

The figures are wall-clock and this machine is shared: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")
LAYOUT = ["generator.num_cpus_per_engine=1", "trainer.dp_size=1", "trainer.num_cpus_per_worker=1"]
"""One core each: the main job's rank takes both cores (``num_cpus_per_worker: 2``), which while
the engine generates beside it runs two OpenMP threads on one free core."""
PHASES = ("generate", "forward", "train", "sync")
"""The step's timed phases, reported per row (in async mode ``generate`` is the wait for a batch)."""
QUIET = [
    "trainer.eval_before_train=false", "trainer.eval_interval=0", "data.num_eval_prompts=0",
    "trainer.export_hf=false", "trainer.ckpt_interval=0",
]  # fmt: skip


def row_overrides(row: str) -> list[str]:
    """``"1"`` -> staleness 1; ``"1p"`` -> staleness 1 with partial rollouts."""
    k = int(row.rstrip("p"))
    out = [f"trainer.max_staleness={k}"]
    if row.endswith("p"):
        out.append("trainer.partial_rollouts=true")
    return out


def batch_overrides(prompts: int) -> list[str]:
    return [f"trainer.train_batch_size={prompts}", f"trainer.policy_mini_batch_size={prompts // 2}"]


def train_row(row: str, steps: int, prompts: int, workdir: Path) -> dict[str, float]:
    run = workdir / f"row_{row}"
    cmd = [SKYRL_TRAIN, *LAYOUT, *QUIET, *batch_overrides(prompts), *row_overrides(row)]
    cmd.append(f"trainer.total_steps={steps}")
    cmd.append(f"hydra.run.dir={run}")
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"row {row} failed:\n{result.stderr[-3000:]}")
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if 2 <= r["step"] <= steps - 1]
    wall = sum(r["timing/step_s"] for r in timed)
    tokens = sum(r["policy/loss_tokens"] for r in timed)
    if row == "0":  # synchronous: the engine works only in the generate phase
        idle = sum(r["timing/step_s"] - r["timing/generate_s"] for r in timed)
        wait = sum(r["timing/generate_s"] for r in timed)
    else:
        idle = sum(r["async/engine_idle_s"] for r in timed)
        wait = sum(r["async/trainer_wait_s"] for r in timed)
    last = records[-3:]
    return {
        "tokens_per_s": tokens / wall,
        "step_s": wall / len(timed),
        "engine_idle": idle / wall,
        "trainer_wait": wait / wall,
        "staleness_mean": sum(r.get("async/staleness_mean", 0.0) for r in timed) / len(timed),
        "staleness_max": max(r.get("async/staleness_max", 0.0) for r in timed),
        "reward_last3": sum(r["generate/reward_mean"] for r in last) / len(last),
        "run_s": time.perf_counter() - started,
        **{
            phase: sum(r.get(f"timing/{phase}_s", 0.0) for r in timed) / len(timed)
            for phase in PHASES
        },
    }


def simulated_rows(
    ks: list[int], steps: int, prompts: int, train_s: float
) -> dict[int, dict[str, float]]:
    """Generation alone, the trainer replaced by ``train_s`` of sleep per step."""
    import ray
    from transformers import AutoTokenizer

    import skyrl
    from skyrl.api import start_ray
    from skyrl.config.validate import validate
    from skyrl.inference import make_engine
    from skyrl.models.resolve import with_local_model_paths
    from skyrl.rollouts.async_rollouts import AsyncRollouts
    from skyrl.rollouts.sync import SyncRollouts

    cfg = with_local_model_paths(
        validate(skyrl.compose([*LAYOUT, *QUIET, *batch_overrides(prompts)]))
    )
    start_ray(4)
    tok = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)
    engine = make_engine(cfg.generator, cfg.model.path, cfg.model.tokenizer_path)
    out = {}
    try:
        for k in ks:
            source = (
                SyncRollouts(cfg, engine, tok)
                if k == 0
                else AsyncRollouts(cfg, engine, tok, max_staleness=k)
            )
            tokens, idle, wall = 0, 0.0, 0.0
            try:
                for step in range(1, steps + 1):
                    t0 = time.perf_counter()
                    batch, metrics = source.next_batch(step)
                    gen = time.perf_counter() - t0
                    time.sleep(train_s)
                    with source.updating_weights(step):
                        pass
                    if step >= 2:  # step 1 fills the pipeline
                        tokens += int(batch.loss_mask.sum())
                        step_s = time.perf_counter() - t0
                        wall += step_s
                        idle += metrics.get("async/engine_idle_s", step_s - gen)
            finally:
                source.close()
            out[k] = {"gen_tokens_per_s": tokens / wall, "step_s": wall / (steps - 1),
                      "engine_idle": idle / wall}  # fmt: skip
    finally:
        engine.shutdown()
        ray.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (even)")
    parser.add_argument("--rows", default="0,1,2,1p")
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--no-simulated", action="store_true")
    parser.add_argument("--simulated-train-s", type=float, default=20.0)
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the rows' runs here")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rows = args.rows.split(",")
    if not args.no_train:
        with tempfile.TemporaryDirectory(prefix="bench_async_") as tmp:
            work = args.work_dir or Path(tmp)
            results = {row: train_row(row, args.steps, args.prompts, work) for row in rows}
        base = results.get("0", {}).get("tokens_per_s")
        base_step = results.get("0", {}).get("step_s")
        print(f"\ntraining rows: main job at {args.prompts} prompts/step, engine actor 1 CPU + "
              f"1 DeepSpeed rank, steps 2..{args.steps - 1} timed")  # fmt: skip
        print("| max_staleness | tokens trained/s | vs 0 | step s | 0's step / this | engine idle "
              "| trainer wait | staleness mean / max | reward (last 3 steps) |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for row, r in results.items():
            ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
            faster = f"{base_step / r['step_s']:.2f}x" if base_step else "-"
            print(
                f"| {row.replace('p', ' (partial)')} | {r['tokens_per_s']:.1f} | {ratio} "
                f"| {r['step_s']:.1f} | {faster} | {r['engine_idle']:.0%} | {r['trainer_wait']:.0%} "
                f"| {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} "
                f"| {r['reward_last3']:.3f} |"
            )
        print("\nseconds per step by phase (async: generate = the wait for a batch)")
        print("| max_staleness | " + " | ".join(PHASES) + " | step |")
        print("|---|" + "---|" * (len(PHASES) + 1))
        for row, r in results.items():
            cells = " | ".join(f"{r[phase]:.1f}" for phase in PHASES)
            print(f"| {row.replace('p', ' (partial)')} | {cells} | {r['step_s']:.1f} |")
    if not args.no_simulated:
        ks = sorted({int(r.rstrip("p")) for r in rows})
        sim = simulated_rows(ks, max(args.steps, 4), args.prompts, args.simulated_train_s)
        print(f"\nsimulated trainer: {args.simulated_train_s:g} s of sleep per step, "
              "generation alone")  # fmt: skip
        print("| max_staleness | generated tokens/s | step s | engine idle |")
        print("|---|---|---|---|")
        for k, r in sim.items():
            print(f"| {k} | {r['gen_tokens_per_s']:.1f} | {r['step_s']:.1f} "
                  f"| {r['engine_idle']:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
