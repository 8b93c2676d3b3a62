"""Generation throughput on this machine: hf vs vllm engines, and agent-loop overhead.

Run: ``python tests/bench/bench_generation.py [--no-vllm]``. Batch 32 prompts x 64
new tokens (greedy-free sampling at temperature 1 with a fixed seed), a tiny
random model (hidden 64, 2 layers) and a small one (hidden 256, 4 layers).
Agent-loop overhead = (Generator.generate seconds per token) / (engine.generate seconds
per token on the same rendered prompts and sampling) - 1; goal: within 10%. Each
timing is the fastest of 3 runs after a full-size warm-up.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

BATCH, NEW_TOKENS = 32, 64

MODELS = {
    "tiny (h64 x2)": {},
    "small (h256 x4)": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
    },
}


def prompts_and_rows(tok):
    from skyrl.data import arithmetic_rows
    from skyrl.generators.chat import ChatTokens

    rows = arithmetic_rows(BATCH, seed=0)
    chat = ChatTokens(tok)
    messages = [
        r.prompt if isinstance(r.prompt, list) else [{"role": "user", "content": r.prompt}]
        for r in rows
    ]
    return [chat.prompt_ids(m) for m in messages], rows


REPEATS = 3


def timed(fn):
    """Result and the fastest of ``REPEATS`` wall times (the machine is shared and noisy)."""
    best = float("inf")
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def bench_engine(engine, prompts, sp):
    engine.generate(prompts, sp)  # warm-up at full batch size
    out, secs = timed(lambda: engine.generate(prompts, sp))
    tokens = sum(len(g[0].token_ids) for g in out)
    return tokens, secs


def bench_loop(engine, tok, rows, sp):
    from skyrl.envs.math_env import MathEnv
    from skyrl.generators import AgentLoop, Generator, LoopSettings

    loop = AgentLoop(engine, tok, MathEnv, LoopSettings(256, NEW_TOKENS, 1))
    out, secs = timed(lambda: Generator(loop).generate(rows, 1, sp))
    return sum(len(r) for r in out.response_token_ids), secs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from skyrl.inference.base import SamplingParams
    from skyrl.inference.hf import HFEngine
    from skyrl.models import build_tiny_model

    torch.set_num_threads(os.cpu_count() or 1)
    sp = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, seed=0)
    lines = []
    for name, overrides in MODELS.items():
        path = build_tiny_model(**overrides)
        tok = AutoTokenizer.from_pretrained(path)
        prompts, rows = prompts_and_rows(tok)
        hf = HFEngine(path, max_batch_size=BATCH)
        tokens, secs = bench_engine(hf, prompts, sp)
        lines.append((name, "hf", "engine.generate", tokens, secs, None))
        ltokens, lsecs = bench_loop(hf, tok, rows, sp)
        # overhead per generated token, so different sample lengths compare fairly
        overhead = (lsecs / ltokens) / (secs / tokens) - 1
        lines.append((name, "hf", "agent loop", ltokens, lsecs, overhead))
        if not args.no_vllm:
            from skyrl.inference.vllm_engine import VLLMEngine

            vl = VLLMEngine(path, kv_cache_memory_bytes=64 << 20, max_model_len=512)
            tokens, secs = bench_engine(vl, prompts, sp)
            lines.append((name, "vllm", "engine.generate", tokens, secs, None))
            ltokens, lsecs = bench_loop(vl, tok, rows, sp)
            overhead = (lsecs / ltokens) / (secs / tokens) - 1
            lines.append((name, "vllm", "agent loop", ltokens, lsecs, overhead))
            del vl
    print(
        f"\nGeneration, batch {BATCH} x up to {NEW_TOKENS} new tokens, {os.cpu_count()} CPU threads"
    )
    print(
        f"{'model':<17} {'engine':<6} {'path':<16} {'tokens':>6} {'secs':>6} {'tok/s':>7} {'overhead':>8}"
    )
    for name, eng, what, tokens, secs, ov in lines:
        ovs = "" if ov is None else f"{ov:+.1%}"
        print(
            f"{name:<17} {eng:<6} {what:<16} {tokens:>6} {secs:>6.2f} {tokens / secs:>7.0f} {ovs:>8}"
        )


if __name__ == "__main__":
    main()
