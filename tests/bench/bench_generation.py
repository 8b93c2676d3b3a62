"""Generation throughput on this machine: hf vs vllm engines, and agent-loop overhead.

Run: ``python tests/bench/bench_generation.py [--no-vllm]``. Batch 32 prompts x 64
new tokens (greedy-free sampling at temperature 1 with a fixed seed), a tiny
random model (hidden 64, 2 layers) and a small one (hidden 256, 4 layers).
Agent-loop overhead = (Generator.generate seconds per token) / (engine.generate seconds
per token on the same rendered prompts and sampling) - 1; goal: within 10%. Each
timing is the fastest of 3 runs after a full-size warm-up, the two paths timed in
alternation.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
# vLLM on CPU drops torch to 1 thread unless OMP_NUM_THREADS is set, which would also slow
# every hf run after the first vllm engine; give both engines all cores
os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

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


def engine_vs_loop(name: str, backend: str, engine, tok, repeats: int = REPEATS) -> list[tuple]:
    """Table lines for one engine: raw ``engine.generate`` on the rendered arithmetic prompts,
    then the agent loop on the same rows and sampling, with its overhead per generated token
    (so different sample lengths compare fairly).

    Both paths are warmed up, then timed in alternation, ``repeats`` times each, keeping
    the fastest: another job on the shared cores then slows both alike instead of
    whichever ran during it."""
    from skyrl.envs.math_env import MathEnv
    from skyrl.generators import AgentLoop, Generator, LoopSettings
    from skyrl.inference.base import SamplingParams

    sp = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, seed=0)
    prompts, rows = prompts_and_rows(tok)
    loop = AgentLoop(engine, tok, MathEnv, LoopSettings(256, NEW_TOKENS, 1))
    paths = {
        "engine.generate": lambda: engine.generate(prompts, sp),
        "agent loop": lambda: Generator(loop).generate(rows, 1, sp),
    }
    outs = {what: run() for what, run in paths.items()}  # warm-up at full batch size
    secs = dict.fromkeys(paths, float("inf"))
    for _ in range(repeats):
        for what, run in paths.items():
            t0 = time.perf_counter()
            outs[what] = run()
            secs[what] = min(secs[what], time.perf_counter() - t0)
    tokens = sum(len(group[0].token_ids) for group in outs["engine.generate"])
    loop_tokens = sum(len(r) for r in outs["agent loop"].response_token_ids)
    loop_secs = secs["agent loop"]
    overhead = (loop_secs / loop_tokens) / (secs["engine.generate"] / tokens) - 1
    return [
        (name, backend, "engine.generate", tokens, secs["engine.generate"], None),
        (name, backend, "agent loop", loop_tokens, loop_secs, overhead),
    ]


def print_table(title: str, lines: list[tuple]) -> None:
    print(f"\n{title}")
    print(
        f"{'model':<17} {'engine':<6} {'path':<16} {'tokens':>6} {'secs':>6} {'tok/s':>7} {'overhead':>8}"
    )
    for name, eng, what, tokens, secs, ov in lines:
        ovs = "" if ov is None else f"{ov:+.1%}"
        print(
            f"{name:<17} {eng:<6} {what:<16} {tokens:>6} {secs:>6.2f} {tokens / secs:>7.0f} {ovs:>8}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from skyrl.inference.hf import HFEngine
    from skyrl.models import build_tiny_model

    torch.set_num_threads(os.cpu_count() or 1)
    lines = []
    for name, overrides in MODELS.items():
        path = build_tiny_model(**overrides)
        tok = AutoTokenizer.from_pretrained(path)
        lines += engine_vs_loop(name, "hf", HFEngine(path, max_batch_size=BATCH), tok)
        if not args.no_vllm:
            from skyrl.inference.vllm_engine import VLLMEngine

            vl = VLLMEngine(path, kv_cache_memory_bytes=64 << 20, max_model_len=512)
            lines += engine_vs_loop(name, "vllm", vl, tok)
            del vl
    print_table(
        f"Generation, batch {BATCH} x up to {NEW_TOKENS} new tokens, {os.cpu_count()} CPU threads",
        lines,
    )


if __name__ == "__main__":
    main()
