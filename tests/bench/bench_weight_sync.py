"""Weight sync of SmolLM2-135M-Instruct on this machine: shared memory, object store, broadcast.

Run: ``python tests/bench/bench_weight_sync.py [--backend vllm|hf] [--bucket-mb 256]``.
The main job's layout: the policy's DeepSpeed rank(s) (ZeRO 0, fp32) as Ray actors and
one in-process engine in the driver. ``shared_memory`` (the CPU default): rank 0 copies
its weights into one file in /dev/shm and the engine loads from views of it;
``object_store`` streams buckets from rank 0 through Ray into ``engine.update_weights``;
``broadcast`` sends the same buckets over a gloo group. The first two take turns:
``REPEATS`` timed rounds after a warm-up, split into *transfer* (the weights from rank 0
to where the engine reads them) and *load* (the engine's own copy into its model: vLLM's
reload repacks every linear layer for its CPU GEMM, the hf engine copies). Before the
rounds each path's greedy tokens are checked against the engine's at the start. The
last line gives this machine's memcpy speed (one copy of the weights' size between
warm buffers, median of 5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

REPEATS = 5


def timed(fn) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def timed_rounds(paths: dict) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Per path: transfer seconds, load seconds and their sums; the paths take turns, one
    warm-up round and then ``REPEATS`` timed ones (so no path gets a warmer machine)."""
    out: dict[str, tuple[list[float], list[float], list[float]]] = {
        name: ([], [], []) for name in paths
    }
    for round_ in range(REPEATS + 1):
        for name, (transfer, load) in paths.items():
            t0 = time.perf_counter()
            weights = transfer()
            t1 = time.perf_counter()
            load(weights)
            t2 = time.perf_counter()
            del weights
            if round_ > 0:
                for times, value in zip(out[name], (t1 - t0, t2 - t1, t2 - t0), strict=True):
                    times.append(value)
    return out


def memcpy_gbps(nbytes: int) -> float:
    """GB/s of one ``nbytes`` copy between two warm buffers (median of 5)."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / 1e9 / statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="vllm", choices=("vllm", "hf"))
    parser.add_argument("--bucket-mb", type=int, default=256)
    args = parser.parse_args()

    import dataclasses

    import ray
    from transformers import AutoTokenizer

    import skyrl
    from skyrl.config.validate import validate
    from skyrl.inference.base import SamplingParams
    from skyrl.inference.factory import make_engine
    from skyrl.inference.local import generate_batch
    from skyrl.inference.weight_sync import spec_nbytes
    from skyrl.models import resolve_model_path
    from skyrl.trainer.weight_sync import BroadcastWeightSync, SharedMemoryWeightSync
    from skyrl.workers.group import WorkerGroup

    cfg = validate(
        skyrl.compose(
            [f"generator={args.backend}", f"trainer.weight_sync_bucket_mb={args.bucket_mb}"]
        )
    )
    path = resolve_model_path(cfg.model.path)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=path))
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    policy = WorkerGroup("policy", cfg, total_optimizer_steps=1)
    engine = make_engine(cfg.generator, path)
    prompt = [AutoTokenizer.from_pretrained(path).encode("The capital of France is")]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    expected = generate_batch(engine, prompt, greedy)[0][0].token_ids

    bucket_bytes = cfg.trainer.weight_sync_bucket_mb << 20
    shared = SharedMemoryWeightSync(policy, cfg)
    paths = {
        "shared_memory": (shared.stage, engine.update_weights),
        "object_store": (
            lambda: list(policy.stream_weight_buckets(bucket_bytes)),
            engine.update_weights,
        ),
    }
    for name, (transfer, load) in paths.items():  # each path alone gives the same engine
        load(transfer())
        assert generate_batch(engine, prompt, greedy)[0][0].token_ids == expected, name
    results = timed_rounds(paths)
    t0 = time.perf_counter()
    broadcast = BroadcastWeightSync(policy, engine, cfg)
    setup_s = time.perf_counter() - t0
    results["broadcast (gloo)"] = ([], [], timed(broadcast.sync))
    assert generate_batch(engine, prompt, greedy)[0][0].token_ids == expected

    nbytes = sum(spec_nbytes(s) for bucket in broadcast.plan for s in bucket)
    print(
        f"\nWeight sync, SmolLM2-135M fp32 ({nbytes / 1e6:.0f} MB), {args.backend} engine, "
        f"policy dp {cfg.trainer.dp_size}, buckets of {args.bucket_mb} MiB "
        f"({len(broadcast.plan)}), {os.cpu_count()} CPUs; medians of {REPEATS}"
    )
    print(
        f"{'path':<18} {'bytes':>11} {'transfer s':>10} {'GB/s':>6} {'load s':>7} "
        f"{'total s':>8} {'GB/s':>6}"
    )
    for name, (transfer_s, load_s, total_s) in results.items():
        total = statistics.median(total_s)
        split = (
            f"{statistics.median(transfer_s):>10.3f} "
            f"{nbytes / 1e9 / statistics.median(transfer_s):>6.2f} "
            f"{statistics.median(load_s):>7.3f}"
            if transfer_s
            else f"{'-':>10} {'-':>6} {'-':>7}"
        )
        print(f"{name:<18} {nbytes:>11,} {split} {total:>8.3f} {nbytes / 1e9 / total:>6.2f}")
    print(f"broadcast group set-up (once): {setup_s:.2f} s")
    print(
        f"memcpy: {memcpy_gbps(nbytes):.1f} GB/s (torch copy_, warm buffers, {os.cpu_count()} CPUs)"
    )
    shared.close()
    policy.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
