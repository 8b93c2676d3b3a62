"""skyrl against TRL on identical GRPO work, run alternately on this machine (issue 18).

Run: ``make bench-trl`` or ``python tests/bench/bench_trl.py [--rounds 2] [--steps 5]``.

The work, on both sides: SmolLM2-135M-Instruct in fp32, 4 prompts x 4 samples = 16
completions of at most 48 new tokens at temperature 1, GRPO without KL, one AdamW step per
step (lr 1e-5, max_grad_norm 1), no eval, checkpoints or export in the timed steps. The
prompts are skyrl's built-in arithmetic task, the very rows its prompt loader hands the run
step by step (written out with skyrl's own data code), and TRL's reward is skyrl's ``math``
env's grading code (``skyrl/envs/grading.py``).

- TRL 1.16 runs in its own venv (``--trl-venv``, default ``.venv-trl``, created on the first
  run: ``torch==2.13.0 trl==1.16.0`` plus the project venv's transformers and math-verify
  versions, so both sides run the same model code; a second run installs nothing), through
  ``tests/bench/trl_grpo_run.py``: ``GRPOTrainer`` generating with transformers, on 2 torch
  threads, once without and once with gradient checkpointing (TRL's default).
- skyrl runs through its CLI (``skyrl-train``) at the main job's defaults (layout, engine,
  ranks) with only the work above overridden; its phases come from the run's
  ``metrics.jsonl``. The run's last step also saves the final checkpoint: its
  ``timing/checkpoint_s`` is left out of that step's time.

Each round runs TRL, TRL with gradient checkpointing, skyrl; each run takes ``--steps``
steps and reports the mean of steps 2..N (step 1 warms up). The table gives the mean over
rounds (and the min-max of the per-round means) of the step time and its phases; "other" is
the step less the named phases. Tokens trained: real (non-padding) prompt + completion tokens
through forward/backward per step; TRL also computes its padded positions (in brackets);
skyrl computes a prompt once for its 4 samples (``trainer.share_prompts``), so it computes
fewer tokens than its rows hold (in brackets).
Training FLOP/s = 6 x parameters x trained tokens / train seconds, as a share of this
machine's fp32 matmul peak measured here (2048^3, 2 threads, best of ``PEAK_REPEATS``), at
the start and after each skyrl run; the share uses the best of them (these hosts' speed
drifts within a run: one run's first reading was 319 GFLOP/s where others gave 367).
Peak memory: the largest sum of the proportional set sizes (PSS) of a run's process and all
it starts (skyrl: the driver, Ray, the training ranks, the engine), sampled each second
(``process_memory.py``, which reads the PSS in full only when a resident size moved: read in
full every second it slowed skyrl's train phase by about 12%); the table gives the largest over
rounds.
The last line is ``speedup: <TRL s/step without gradient checkpointing / skyrl s/step>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from process_memory import PeakTreeMemory

REPO = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).with_name("trl_grpo_run.py")
TRL_PINS = ("torch==2.13.0", "trl==1.16.0")
"""Pinned in the TRL venv's one pip command (a bare torch pulls a multi-GB CUDA build)."""
SAME_AS_PROJECT = ("transformers", "math-verify")
"""Installed into the TRL venv at the project venv's versions: the same model and grading code."""
THREADS = 2
PEAK_N, PEAK_REPEATS = 2048, 5
NUM_PROMPTS, NUM_SAMPLES, MAX_NEW_TOKENS, LR = 4, 4, 48, 1e-5
PHASES = ("generate_s", "forward_s", "train_s", "sync_s")


class BenchError(Exception):
    """A failure the bench reports as one line."""


@dataclass
class Run:
    name: str
    """Row label."""
    kind: str
    """``trl``, ``trl-gc`` or ``skyrl``."""
    steps_by_round: list[list[dict[str, float]]]
    """Per round, the records of steps 2..N."""
    peak_bytes: int = 0
    """Largest over rounds of the run's peak memory (``process_memory``)."""


def skyrl_overrides(steps: int) -> list[str]:
    """The work, as ``skyrl-train`` overrides; everything else stays at the main job's defaults."""
    return [
        "data=arithmetic", "algorithm=grpo",
        "algorithm.use_kl_loss=false", "algorithm.use_kl_in_reward=false",
        f"trainer.total_steps={steps}",
        f"trainer.train_batch_size={NUM_PROMPTS}", f"trainer.policy_mini_batch_size={NUM_PROMPTS}",
        f"generator.n_samples_per_prompt={NUM_SAMPLES}",
        f"generator.max_generate_length={MAX_NEW_TOKENS}", "generator.sampling.temperature=1.0",
        f"trainer.policy_optimizer.lr={LR}", "trainer.policy_optimizer.max_grad_norm=1.0",
        "trainer.eval_before_train=false", "trainer.eval_interval=0", "data.num_eval_prompts=0",
        "trainer.export_hf=false", "trainer.ckpt_interval=0",
    ]  # fmt: skip


# -- the TRL venv ---------------------------------------------------------------------------


def trl_requirements() -> list[str]:
    return [*TRL_PINS, *(f"{name}=={version(name)}" for name in SAME_AS_PROJECT)]


def ensure_trl_venv(venv: Path) -> Path:
    """The TRL venv's python; creates the venv and installs into it when its stamp is missing."""
    python = venv / "bin" / "python"
    requirements = trl_requirements()
    digest = hashlib.sha1(" ".join(requirements).encode()).hexdigest()[:12]
    stamp = venv / f".bench-trl-{digest}"
    if stamp.exists() and python.exists():
        print(f"TRL venv: {venv} (up to date, nothing installed)")
        return python
    t0 = time.perf_counter()
    base_python = getattr(sys, "_base_executable", None) or shutil.which("python3") or "python3"
    if not python.exists():
        made = subprocess.run(
            [base_python, "-m", "venv", str(venv)], capture_output=True, text=True, check=False
        )
        if made.returncode:
            raise BenchError(f"creating the TRL venv {venv} failed: {last_line(made.stderr)}")
    log = venv / "bench-trl-install.log"
    print(f"TRL venv: installing {' '.join(requirements)} into {venv} (log: {log})", flush=True)
    with log.open("w") as f:
        rc = subprocess.run(
            [str(python), "-m", "pip", "install", *requirements], stdout=f, stderr=subprocess.STDOUT
        ).returncode
    if rc:
        raise BenchError(
            f"installing TRL into {venv} failed (pip exit {rc}): {last_line(log.read_text())} "
            f"(full log: {log})"
        )
    for old in venv.glob(".bench-trl-*"):
        old.unlink()
    stamp.touch()
    size_gb = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file()) / 1e9
    print(f"TRL venv: installed in {time.perf_counter() - t0:.0f} s, {size_gb:.2f} GB on disk")
    return python


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


# -- machine and model ----------------------------------------------------------------------


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (lscpu failed)"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def matmul_gflops(
    m: int, k: int, n: int, dtype=None, autocast: bool = False, repeats: int = PEAK_REPEATS
) -> float:
    """GFLOP/s of the best of ``repeats`` torch products ``[m, k] @ [k, n]`` in ``dtype``
    (default fp32), under ``torch.autocast("cpu", torch.bfloat16)`` with ``autocast``."""
    import torch

    a = torch.randn(m, k).to(dtype or torch.float32)
    b = torch.randn(k, n).to(dtype or torch.float32)
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


def fp32_peak_gflops() -> float:
    """Best of ``PEAK_REPEATS`` torch fp32 matmuls of ``PEAK_N``^3 on ``THREADS`` threads."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return matmul_gflops(PEAK_N, PEAK_N, PEAK_N)
    finally:
        torch.set_num_threads(threads)


def count_params(model_dir: Path) -> int:
    """Parameters of the model (tied embeddings counted once)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())


def write_prompts(path: Path, steps: int) -> None:
    """The prompts skyrl's loader hands steps 1..``steps`` of the run, in order, with answers."""
    import skyrl
    from skyrl.config.preflight import preflight
    from skyrl.config.validate import validate
    from skyrl.rollouts.dataloader import PromptLoader

    cfg = validate(skyrl.compose(skyrl_overrides(steps)))
    checked = preflight(cfg, for_run=True)
    assert checked.prompts is not None
    t = cfg.trainer
    loader = PromptLoader(checked.prompts.train, t.train_batch_size, t.seed)
    with path.open("w") as f:
        for step in range(1, steps + 1):
            for row in loader.next_batch(f"s{step}"):
                record = {"prompt": row.prompt, "answer": str(row.extras["answer"])}
                f.write(json.dumps(record) + "\n")


# -- the runs -------------------------------------------------------------------------------


def run_logged(cmd: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> int:
    """Runs ``cmd`` to completion; returns the peak memory of it and all it started, bytes."""
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        with PeakTreeMemory(proc.pid) as memory:
            rc = proc.wait()
    if rc:
        raise BenchError(f"{what} failed (exit {rc}): {last_line(log.read_text())} (log: {log})")
    return memory.peak_bytes


def run_trl(
    python: Path, model: Path, prompts: Path, steps: int, gc: bool, out: Path
) -> tuple[list[dict[str, float]], int]:
    """The run's per-step records and its peak memory in bytes."""
    env = os.environ | {
        "OMP_NUM_THREADS": str(THREADS),
        "MKL_NUM_THREADS": str(THREADS),
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("PYTHONPATH", None)
    cmd = [
        str(python), str(HELPER), "--model", str(model), "--prompts", str(prompts),
        "--steps", str(steps), "--out", str(out), "--num-prompts", str(NUM_PROMPTS),
        "--num-generations", str(NUM_SAMPLES), "--max-new-tokens", str(MAX_NEW_TOKENS),
        "--lr", str(LR), *(["--gradient-checkpointing"] if gc else []),
    ]  # fmt: skip
    peak = run_logged(cmd, out.with_suffix(".log"), f"TRL run{' (grad ckpt)' if gc else ''}", env)
    return trl_records(out), peak


def trl_records(out: Path) -> list[dict[str, float]]:
    """Per-step records of a finished TRL run (the helper's json)."""
    result = json.loads(out.read_text())
    records = result["steps"]
    for record, reward in zip(records, result["rewards"], strict=False):
        record["reward"] = reward
    return records


def run_skyrl(steps: int, run_dir: Path) -> tuple[list[dict[str, float]], int]:
    """The run's per-step records and its peak memory in bytes."""
    cmd = [str(Path(sys.executable).parent / "skyrl-train"), f"hydra.run.dir={run_dir}"]
    peak = run_logged(cmd + skyrl_overrides(steps), run_dir.with_suffix(".log"), "skyrl run")
    records = skyrl_records(run_dir)
    # the run's final checkpoint (1.6 GB: weights and AdamW state) is of no use to the bench;
    # kept, every bench run left 3 GB in /tmp
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return records, peak


def skyrl_records(run_dir: Path) -> list[dict[str, float]]:
    """Per-step records of a finished skyrl run, from its ``metrics.jsonl``."""
    from skyrl.tracking import metric_names as names
    from skyrl.tracking import read_history

    phase_keys = {
        "generate_s": names.PHASE_TIMES["gen"],
        "forward_s": names.PHASE_TIMES["fwd"],
        "train_s": names.PHASE_TIMES["train"],
        "sync_s": names.PHASE_TIMES["sync"],
    }
    records = []
    for row in read_history(run_dir):
        if row["step"] < 1:
            continue
        left_out = row.get("timing/checkpoint_s", 0.0) + row.get(names.PHASE_TIMES["eval"], 0.0)
        record = {"step": row["step"], "step_s": row[names.STEP_TIME] - left_out}
        record |= {k: row.get(key, 0.0) for k, key in phase_keys.items()}
        record["tokens"] = row[names.POLICY.pack("local_tokens")]
        record["row_tokens"] = record["tokens"] + row.get(
            names.POLICY.pack("shared_prefix_tokens"), 0.0
        )
        record["loss_tokens"] = row[names.POLICY.loss_tokens]
        record["reward"] = row.get(names.REWARD, float("nan"))
        records.append(record)
    return records


def after_warmup(records: list[dict[str, float]], steps: int, what: str) -> list[dict]:
    kept = [r for r in records if 2 <= r["step"] <= steps]
    if len(kept) != steps - 1:
        raise BenchError(f"{what}: {len(records)} step records, steps 2..{steps} expected")
    return kept


# -- the table ------------------------------------------------------------------------------


def mean_of(run: Run, key: str) -> float:
    """Mean over rounds of the per-round mean over steps 2..N."""
    return statistics.fmean(
        statistics.fmean(r.get(key, 0.0) for r in rnd) for rnd in run.steps_by_round
    )


def round_means(run: Run, key: str) -> list[float]:
    return [statistics.fmean(r[key] for r in rnd) for rnd in run.steps_by_round]


def print_table(runs: list[Run], params: int, peak_gflops: float) -> None:
    head = (
        f"{'run':<20} {'s/step':>7} {'(min-max)':>13} {'generate':>9} {'logprob fwd':>11} "
        f"{'train':>7} {'sync':>6} {'other':>6} {'tokens trained/step':>22} "
        f"{'train GFLOP/s':>13} {'of peak':>7} {'peak mem GB':>11} {'reward':>6}"
    )
    print(head)
    print("-" * len(head))
    for run in runs:
        step_s = mean_of(run, "step_s")
        per_round = round_means(run, "step_s")
        phases = [mean_of(run, k) for k in PHASES]
        other = step_s - sum(phases)
        tokens = mean_of(run, "tokens")
        tokens_text = f"{tokens:.0f}"
        if run.kind.startswith("trl"):
            tokens_text += f" ({mean_of(run, 'padded_tokens'):.0f} padded)"
        elif mean_of(run, "row_tokens") > tokens:
            tokens_text += f" ({mean_of(run, 'row_tokens'):.0f} in rows)"
        gflops = 6 * params * tokens / phases[2] / 1e9 if phases[2] else float("nan")
        spread = f"({min(per_round):.1f}-{max(per_round):.1f})"
        print(
            f"{run.name:<20} {step_s:7.1f} {spread:>13} {phases[0]:9.1f} {phases[1]:11.1f} "
            f"{phases[2]:7.1f} {phases[3]:6.1f} {other:6.1f} {tokens_text:>22} "
            f"{gflops:13.1f} {gflops / peak_gflops:7.1%} {run.peak_bytes / 1e9:11.1f} "
            f"{mean_of(run, 'reward'):6.2f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of (trl, trl-gc, skyrl)")
    p.add_argument("--steps", type=int, default=5, help="steps per run; steps 2..N are reported")
    p.add_argument("--trl-venv", type=Path, default=REPO / ".venv-trl")
    p.add_argument("--work-dir", type=Path, default=None, help="keep run dirs and logs here")
    args = p.parse_args()
    if args.steps < 2 or args.rounds < 1:
        p.error("--steps must be >= 2 (step 1 is warm-up) and --rounds >= 1")
    try:
        bench(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


def bench(args: argparse.Namespace) -> None:
    from skyrl.models.smollm2 import ensure_converted

    python = ensure_trl_venv(args.trl_venv.resolve())
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    model = ensure_converted()
    params = count_params(model)
    peaks = [fp32_peak_gflops()]
    prompts = work / "prompts.jsonl"
    write_prompts(prompts, args.steps)
    print(
        f"CPU: {cpu_model()}; fp32 matmul peak {peaks[0]:.1f} GFLOP/s ({PEAK_N}^3, {THREADS} threads)"
    )
    print(f"model: {model} ({params:,} parameters, fp32); work dir: {work}")
    runs = {
        "trl": Run("TRL (no grad ckpt)", "trl", []),
        "trl-gc": Run("TRL (grad ckpt)", "trl-gc", []),
        "skyrl": Run("skyrl (default)", "skyrl", []),
    }
    for rnd in range(1, args.rounds + 1):
        for kind, run in runs.items():
            t0 = time.perf_counter()
            if kind == "skyrl":
                records, peak_bytes = run_skyrl(args.steps, work / f"skyrl-r{rnd}")
                peaks.append(fp32_peak_gflops())  # the machine's state next to skyrl's steps
            else:
                out = work / f"{kind}-r{rnd}.json"
                records, peak_bytes = run_trl(
                    python, model, prompts, args.steps, kind == "trl-gc", out
                )
            kept = after_warmup(records, args.steps, f"{kind} round {rnd}")
            run.steps_by_round.append(kept)
            run.peak_bytes = max(run.peak_bytes, peak_bytes)
            per_step = ", ".join(f"{r['step_s']:.1f}" for r in kept)
            mean = statistics.fmean(r["step_s"] for r in kept)
            wall = time.perf_counter() - t0
            print(
                f"round {rnd} {kind}: {mean:.1f} s/step (steps 2-{args.steps}: {per_step}; "
                f"run {wall:.0f} s; peak memory {peak_bytes / 1e9:.1f} GB)",
                flush=True,
            )
    print(f"\nmean of steps 2-{args.steps} over {args.rounds} round(s); seconds per step")
    peak = max(peaks)
    print(
        f"fp32 matmul peak: best of {len(peaks)} measurements, one at the start and one after "
        f"each skyrl run ({', '.join(f'{p:.1f}' for p in peaks)} GFLOP/s): {peak:.1f}"
    )
    print_table(list(runs.values()), params, peak)
    trl_s, trl_gc_s, skyrl_s = (mean_of(r, "step_s") for r in runs.values())
    print(f"speedup vs TRL with gradient checkpointing: {trl_gc_s / skyrl_s:.2f}")
    print(f"speedup: {trl_s / skyrl_s:.2f}")


if __name__ == "__main__":
    main()
