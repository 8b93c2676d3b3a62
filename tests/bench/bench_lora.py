"""LoRA vs full weights on SmolLM2-135M-Instruct, the main job's layout (its config's
``trainer.dp_size`` DeepSpeed policy ranks, ``zero_stage`` and ``precision``: 1 rank, ZeRO 0,
fp32 as of this writing; one in-process vLLM engine). The table's title prints the layout.

Run: ``python tests/bench/bench_lora.py [--rank 16] [--backend vllm|hf] [--main-job]``.

For each of ``full`` (rank 0), ``adapter`` (rank r, ``trainer.lora_sync=adapter``) and
``merged`` (rank r, ``trainer.lora_sync=merged``): the bytes one weight sync sends and its
seconds (object store into the engine; median of ``REPEATS`` after a warm-up), the Adam
state over all ranks, one training step on a main-job-sized batch (8 prompts x 4 samples of
fake rollouts, up to 192 tokens; the step's train and logprob-forward seconds, best of
``REPEATS``), and each rank's peak resident memory (``VmHWM``) after it.

``--main-job`` also runs ``skyrl-train`` itself (16 steps, evals) full and with
``model.lora.rank`` (at ``--lora-lr``) and prints each run's summary lines (about 20
minutes each on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

REPEATS = 3
PROMPTS, SAMPLES = 8, 4


def repeat_times(fn) -> list[float]:
    """Seconds of ``REPEATS`` calls of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_mode(mode: str, rank: int, backend: str) -> dict[str, float]:
    import torch

    import skyrl
    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch import compute_prompt_mini_batch_boundaries
    from skyrl.config.validate import validate
    from skyrl.dispatch import MeshDispatch
    from skyrl.inference.factory import make_engine
    from skyrl.inference.weight_sync import spec_nbytes
    from skyrl.models import resolve_model_path
    from skyrl.models.lora import engine_lora
    from skyrl.workers.fake_rollouts import fake_rollouts
    from skyrl.workers.group import WorkerGroup

    overrides = [f"generator={backend}"]
    if mode != "full":
        overrides += [f"model.lora.rank={rank}", f"trainer.lora_sync={mode}"]
    cfg = validate(skyrl.compose(overrides))
    path = resolve_model_path(cfg.model.path)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=path))
    g = cfg.generator
    policy = WorkerGroup("policy", cfg, total_optimizer_steps=100)
    engine = make_engine(g, path, lora=engine_lora(cfg))
    try:
        bucket_bytes = cfg.trainer.weight_sync_bucket_mb << 20
        plan = policy.run("weight_sync_plan", bucket_bytes)[0]
        sync_bytes = sum(spec_nbytes(s) for bucket in plan for s in bucket)
        sync_s = statistics.median(
            repeat_times(lambda: engine.update_weights(policy.stream_weight_buckets(bucket_bytes)))
        )
        vocab = engine.tokenizer.vocab_size if hasattr(engine, "tokenizer") else 49152
        batch = fake_rollouts(
            PROMPTS, SAMPLES, vocab_size=vocab, prompt_len=(60, 120),
            response_len_mean=40.0, response_len_sigma=0.5, max_seq_len=g.max_seq_len, seed=0,
        )  # fmt: skip
        gen = torch.Generator().manual_seed(0)
        adv = torch.randn(len(batch), 1, generator=gen) * batch.loss_mask
        batch = batch.replace(old_logprobs=batch.rollout_logprobs, advantages=adv)
        uids = batch.metadata["uids"]
        bounds = compute_prompt_mini_batch_boundaries(uids, PROMPTS, PROMPTS)

        def weights(mb):
            return compute_loss_weights("token_mean", mb.loss_mask, mb.metadata["uids"], 192)

        staged = MeshDispatch.stage_chunks(
            cfg.trainer.dp_size, batch, bounds, loss_weights_fn=weights
        )
        forward_s = min(repeat_times(lambda: policy.forward(staged, len(batch))))
        train_s = min(repeat_times(lambda: policy.train_mini_batch(staged[0])))
        peak = [peak_rss_mb(pid) for pid in policy.run("pid")]
        state = sum(policy.run("optimizer_state_bytes"))
    finally:
        engine.shutdown()
        policy.shutdown()
    return {
        "sync MB": sync_bytes / 1e6,
        "sync s": sync_s,
        "sync GB/s": sync_bytes / 1e9 / sync_s,
        "Adam state MB": state / 1e6,
        "train s": train_s,
        "logprob fwd s": forward_s,
        "peak rank MB": max(peak),
    }


def main_job(rank: int, lora_lr: float) -> None:
    train = str(Path(sys.executable).parent / "skyrl-train")
    for name, args in (
        ("full", []),
        (f"lora r{rank}", [f"model.lora.rank={rank}", f"trainer.policy_optimizer.lr={lora_lr}"]),
    ):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            result = subprocess.run(
                [train, f"hydra.run.dir={out}", *args], capture_output=True, text=True
            )
            secs = time.perf_counter() - t0
        tail = [line for line in result.stdout.splitlines() if line.strip()][-6:]
        print(f"\n== main job, {name} ({secs:.0f} s, exit {result.returncode})")
        print("\n".join(tail))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--backend", default="vllm", choices=("vllm", "hf"))
    parser.add_argument("--main-job", action="store_true")
    parser.add_argument("--lora-lr", type=float, default=1e-4)
    args = parser.parse_args()

    import ray

    import skyrl
    from skyrl.config.validate import resolve_precision, validate

    cfg = validate(skyrl.compose([f"generator={args.backend}"]))
    t = cfg.trainer
    layout = f"dp {t.dp_size} ZeRO-{t.zero_stage} {resolve_precision(cfg)}"
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    rows = {
        mode: bench_mode(mode, args.rank, args.backend) for mode in ("full", "adapter", "merged")
    }
    ray.shutdown()
    columns = list(rows["full"])
    print(
        f"\nLoRA rank {args.rank} vs full, SmolLM2-135M, {layout}, {args.backend} "
        f"engine, {os.cpu_count()} CPUs; train/fwd: {PROMPTS}x{SAMPLES} fake rollouts"
    )
    print(f"{'mode':<8} " + " ".join(f"{c:>14}" for c in columns))
    for mode, row in rows.items():
        print(f"{mode:<8} " + " ".join(f"{row[c]:>14.3f}" for c in columns))
    if args.main_job:
        main_job(args.rank, args.lora_lr)


if __name__ == "__main__":
    main()
