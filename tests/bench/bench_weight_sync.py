"""Weight sync of SmolLM2-135M-Instruct on this machine: object store vs broadcast group.

Run: ``python tests/bench/bench_weight_sync.py [--backend vllm|hf] [--bucket-mb 256]``.
The main job's layout: 2 DeepSpeed policy ranks (ZeRO 0, fp32) as Ray actors and one
in-process engine in the driver. ``object_store`` streams buckets from rank 0 through Ray
into ``engine.update_weights``; ``broadcast`` sends the same buckets over a gloo group
(``trainer.weight_sync=broadcast``). Each is timed ``REPEATS`` times after one warm-up;
after each path the engine's greedy tokens are checked against the first sync's.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="vllm", choices=("vllm", "hf"))
    parser.add_argument("--bucket-mb", type=int, default=256)
    args = parser.parse_args()

    import dataclasses

    import ray

    import skyrl
    from skyrl.config.validate import validate
    from skyrl.inference.base import SamplingParams
    from skyrl.inference.factory import make_engine
    from skyrl.inference.local import generate_batch
    from skyrl.inference.weight_sync import spec_nbytes
    from skyrl.models import resolve_model_path
    from skyrl.trainer.weight_sync import BroadcastWeightSync
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
    prompt = [engine.tokenizer.encode("The capital of France is")]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    expected = generate_batch(engine, prompt, greedy)[0][0].token_ids

    bucket_bytes = cfg.trainer.weight_sync_bucket_mb << 20
    results = {}
    results["object_store"] = timed(
        lambda: engine.update_weights(policy.stream_weight_buckets(bucket_bytes))
    )
    assert generate_batch(engine, prompt, greedy)[0][0].token_ids == expected
    t0 = time.perf_counter()
    broadcast = BroadcastWeightSync(policy, engine, cfg)
    setup_s = time.perf_counter() - t0
    results["broadcast (gloo)"] = timed(broadcast.sync)
    assert generate_batch(engine, prompt, greedy)[0][0].token_ids == expected

    size_mb = sum(spec_nbytes(s) for bucket in broadcast.plan for s in bucket) / 2**20
    print(
        f"\nWeight sync, SmolLM2-135M fp32 ({size_mb:.0f} MiB), {args.backend} engine, "
        f"buckets of {args.bucket_mb} MiB ({len(broadcast.plan)}), {os.cpu_count()} CPUs"
    )
    print(f"{'path':<18} {'min s':>7} {'median s':>9} {'max s':>7}")
    for name, times in results.items():
        print(f"{name:<18} {min(times):>7.2f} {statistics.median(times):>9.2f} {max(times):>7.2f}")
    print(f"broadcast group set-up (once): {setup_s:.2f} s")
    policy.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
