"""Benchmark of mini-batch boundaries, DP staging and token-budget packing.

Run: ``python tests/bench/bench_batching.py`` (about a minute on 2 cores).

Lengths: prompt 50-500 tokens (uniform) + response log-normal (median 300,
sigma 1), clipped so a sequence is at most 4096 tokens; 8 samples per prompt.

1. Quality on 4096 sequences, 8 mini-batches, dp_size 2 and 4, several caps:
   packed fill ratio (real tokens / (micro batches x cap), every rank running
   the max count) vs fixed-count padded micro batches (same rows per micro
   batch on average, contiguous, each padded to its longest row); micro batches
   vs the lower bound sum over mini-batches of max over ranks ceil(tokens/cap)
   (a cap below the longest sequence leaves those alone, over the cap: fill
   and the bound then count them as if they fit);
   rank token imbalance (max/min) of token-balanced vs contiguous splits.
2. Wall time of boundaries + staging + packing for 1e4..1e6 sequences, dp 4,
   cap 4096, 10 mini-batches. What is timed: prompt-unit boundaries on the uid
   strings, per mini-batch padding size + row-to-rank assignment on the length
   array (the same functions `MeshDispatch.stage_chunks` runs, without building
   tensors), and `pack_micro_batches` for every rank chunk.
"""

from __future__ import annotations

import math
import time

import numpy as np

from skyrl.batch import compute_prompt_mini_batch_boundaries, pack_micro_batches
from skyrl.dispatch import assign_rows_to_ranks

MAX_SEQ_LEN = 4096
SAMPLES_PER_PROMPT = 8


def sample_lengths(num_sequences: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(50, 501, num_sequences)
    response = rng.lognormal(np.log(300), 1.0, num_sequences).astype(np.int64) + 1
    return np.minimum(prompt + response, MAX_SEQ_LEN)


def rank_chunks(lengths: np.ndarray, bounds, dp_size: int, balance: str):
    """Per mini-batch, per rank: the row lengths after padding (row 0's first token each)."""
    for start, end in bounds:
        mini = lengths[start:end]
        pad = (-len(mini)) % dp_size
        mini = np.concatenate([mini, np.full(pad, min(int(mini[0]), 1), dtype=mini.dtype)])
        yield [mini[rows] for rows in assign_rows_to_ranks(mini, dp_size, balance)]


def quality_row(lengths: np.ndarray, bounds, dp_size: int, cap: int) -> dict[str, float]:
    executed = lower = padded_slots = padded_peak = 0
    real = int(lengths.sum())
    imbalance = {"tokens": [], "contiguous": []}
    for balance in imbalance:
        for chunks in rank_chunks(lengths, bounds, dp_size, balance):
            tokens = [int(c.sum()) for c in chunks]
            imbalance[balance].append(max(tokens) / min(tokens))
            if balance != "tokens":
                continue
            counts = [len(pack_micro_batches(c, cap)) for c in chunks]
            executed += max(counts) * dp_size
            lower += max(math.ceil(t / cap) for t in tokens) * dp_size
            rows_per_mb = max(1, round(len(chunks[0]) / max(counts)))
            for c in chunks:
                for s in range(0, len(c), rows_per_mb):
                    part = c[s : s + rows_per_mb]
                    padded_slots += len(part) * int(part.max())
                    padded_peak = max(padded_peak, len(part) * int(part.max()))
    return {
        "packed_fill": real / (executed * cap),
        "padded_fill": real / padded_slots,
        "padded_peak_tokens": padded_peak,
        "micro_batches": executed,
        "lower_bound": lower,
        "imbalance_balanced": max(imbalance["tokens"]),
        "imbalance_contiguous": max(imbalance["contiguous"]),
    }


def print_quality() -> None:
    lengths = sample_lengths(4096)
    num_prompts = len(lengths) // SAMPLES_PER_PROMPT
    uids = [f"p{i // SAMPLES_PER_PROMPT}" for i in range(len(lengths))]
    bounds = compute_prompt_mini_batch_boundaries(uids, num_prompts // 8, num_prompts)
    print(
        f"quality: {len(lengths)} sequences, {len(bounds)} mini-batches, tokens {lengths.sum()}, "
        f"mean length {lengths.mean():.0f}, p99 {np.percentile(lengths, 99):.0f}, max {lengths.max()}"
    )
    header = (
        f"{'dp':>3} {'cap':>6} | {'packed fill':>11} {'padded fill':>11} {'padded peak tok':>15} | "
        f"{'micro batches':>13} {'lower bound':>11} | {'imbalance bal':>13} {'imbalance contig':>16}"
    )
    print(header)
    print("-" * len(header))
    for dp_size in (2, 4):
        for cap in (2048, 4096, 8192, 16384):
            r = quality_row(lengths, bounds, dp_size, cap)
            print(
                f"{dp_size:>3} {cap:>6} | {r['packed_fill']:>11.3f} {r['padded_fill']:>11.3f} "
                f"{r['padded_peak_tokens']:>15} | {r['micro_batches']:>13} {r['lower_bound']:>11} | "
                f"{r['imbalance_balanced']:>13.3f} {r['imbalance_contiguous']:>16.3f}"
            )


def time_pipeline(num_sequences: int, dp_size: int = 4, cap: int = 4096) -> dict[str, float]:
    lengths = sample_lengths(num_sequences, seed=1)
    num_prompts = num_sequences // SAMPLES_PER_PROMPT
    uids = [f"p{i // SAMPLES_PER_PROMPT}" for i in range(num_prompts * SAMPLES_PER_PROMPT)]
    t0 = time.perf_counter()
    bounds = compute_prompt_mini_batch_boundaries(uids, num_prompts // 10, num_prompts)
    t1 = time.perf_counter()
    chunks = [c for mb in rank_chunks(lengths, bounds, dp_size, "tokens") for c in mb]
    t2 = time.perf_counter()
    num_micro = sum(len(pack_micro_batches(c, cap)) for c in chunks)
    t3 = time.perf_counter()
    return {
        "boundaries": t1 - t0,
        "staging": t2 - t1,
        "packing": t3 - t2,
        "total": t3 - t0,
        "micro_batches": num_micro,
    }


def print_timing() -> None:
    print(
        "\nwall time (s), dp 4, cap 4096, 10 mini-batches; staging = pad sizes + rank assignment "
        "on lengths (no tensors)"
    )
    header = f"{'sequences':>10} | {'boundaries':>10} {'staging':>8} {'packing':>8} {'total':>7} | {'us/seq':>6} {'micro batches':>13}"
    print(header)
    print("-" * len(header))
    for n in (10_000, 100_000, 1_000_000):
        r = min((time_pipeline(n) for _ in range(2)), key=lambda r: r["total"])
        print(
            f"{n:>10} | {r['boundaries']:>10.3f} {r['staging']:>8.3f} {r['packing']:>8.3f} "
            f"{r['total']:>7.3f} | {r['total'] / n * 1e6:>6.2f} {r['micro_batches']:>13}"
        )


if __name__ == "__main__":
    start = time.perf_counter()
    print_quality()
    print_timing()
    print(f"\nbenchmark finished in {time.perf_counter() - start:.1f} s")
