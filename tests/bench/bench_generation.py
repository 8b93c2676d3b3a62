"""Generation on this machine: a multi-turn straggler workload (lock-step vs per-request
turns), hf vs vllm throughput, and agent-loop overhead.

Run: ``python tests/bench/bench_generation.py [--no-vllm]``.

Straggler workload (``straggler``): 32 trajectories of 1-4 turns, each turn's length
drawn long-tailed (log-normal, 8-160 tokens), every 4th trajectory's env step taking
0.25 s; on the small model. ``per-request`` is the agent loop as it is (each turn its own
request; the engine batches what is in flight: vLLM continuously). ``lock-step``
re-creates the batching before it (``RequestBatcher``): one engine call at a time,
sent when every live trajectory waits or 20 ms after the first request, and answered as
a whole. Both paths get the same per-request seeds, so they generate the same tokens;
wall time and tokens/s, best of 3, alternating. Goal: per-request >= 1.3x.

Throughput: batch 32 prompts x 64 new tokens (temperature 1, a fixed seed), a tiny
random model (hidden 64, 2 layers) and a small one (hidden 256, 4 layers).
Agent-loop overhead = (Generator.generate seconds per token) / (generate_batch seconds
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
STRAGGLER_MODEL = "small (h256 x4)"


def engine_vs_loop(name: str, backend: str, engine, tok, repeats: int = REPEATS) -> list[tuple]:
    """Table lines for one engine: raw ``engine.generate`` on the rendered arithmetic prompts,
    then the agent loop on the same rows and sampling, with its overhead per generated token
    (so different sample lengths compare fairly).

    Both paths are warmed up, then timed in alternation, ``repeats`` times each, keeping
    the fastest: another job on the shared cores then slows both alike instead of
    whichever ran during it."""
    from skyrl.envs.math_env import MathEnv
    from skyrl.generators import AgentLoop, Generator, LoopSettings
    from skyrl.inference import generate_batch
    from skyrl.inference.base import SamplingParams

    sp = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, seed=0)
    prompts, rows = prompts_and_rows(tok)
    loop = AgentLoop(engine, tok, MathEnv, LoopSettings(256, NEW_TOKENS, 1))
    paths = {
        "engine.generate": lambda: generate_batch(engine, prompts, sp),
        "agent loop": lambda: Generator(loop, engine).generate(rows, 1, sp),
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


STRAGGLERS, SLOW_ENV_S, MAX_TURNS = 32, 0.25, 4


def straggler_rows(seed: int = 0):
    """32 single-sample prompts, each with its turn count, per-turn lengths and env delay."""
    import random

    from skyrl.data.prompts import PromptRow

    rng = random.Random(seed)
    rows = []
    for i in range(STRAGGLERS):
        turns = rng.randint(1, MAX_TURNS)
        lengths = [min(160, max(8, int(rng.lognormvariate(3.0, 0.8)))) for _ in range(turns)]
        extras = {"turns": turns, "lengths": lengths, "slow": i % 4 == 0}
        rows.append(PromptRow(f"Tell me about topic {i}.", "straggler", extras, uid=f"t{i}"))
    return rows


def straggler_loops(engine, tok):
    """The two drivers over the same engine: per-request (the agent loop) and lock-step."""
    import asyncio
    import dataclasses

    from skyrl.envs.base import StepResult, TextEnv
    from skyrl.generators import AgentLoop, LoopSettings

    class StragglerEnv(TextEnv):
        """Ends after ``extras['turns']`` turns; slow trajectories take SLOW_ENV_S per step."""

        def init(self, prompt, extras):
            self.turn = 0
            return super().init(prompt, extras)

        def step(self, action_text):
            self.turn += 1
            if self.extras["slow"]:
                time.sleep(SLOW_ENV_S)
            if self.turn >= self.extras["turns"]:
                return StepResult([], 1.0, True)
            return StepResult([{"role": "user", "content": "go on"}], 0.0, False)

    class PerRequest(AgentLoop):
        """The agent loop, each turn's length taken from the row."""

        async def _generate(self, context, sampling, row, sample, turn):
            n = row.extras["lengths"][turn]
            return await super()._generate(
                context, dataclasses.replace(sampling, max_tokens=n), row, sample, turn
            )

    class LockStep(PerRequest):
        """Turns batched as before: one engine call in flight, sent when every live trajectory
        waits (or 20 ms after the first request), answered when all of it is done."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.engine_inner, self.engine = self.engine, self
            self.active, self.pending, self.running, self.timer = 0, [], False, None

        async def run_trajectory(self, row, sample, sampling):
            self.active += 1
            try:
                return await super().run_trajectory(row, sample, sampling)
            finally:
                self.active -= 1
                self.flush()

        async def generate(self, prompt_ids, sampling, route_key=None):
            future = asyncio.get_running_loop().create_future()
            self.pending.append((prompt_ids, sampling, route_key, future))
            self.flush()
            return await future

        def flush(self, timer: bool = False):
            if timer:
                self.timer = None
            if self.running or not self.pending:
                return
            if len(self.pending) < self.active and not timer:
                if self.timer is None:
                    self.timer = asyncio.get_running_loop().call_later(0.02, self.flush, True)
                return
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            batch, self.pending, self.running = self.pending, [], True
            asyncio.get_running_loop().create_task(self.send(batch))

        async def send(self, batch):
            calls = [self.engine_inner.generate(p, sp, key) for p, sp, key, _ in batch]
            try:
                outs = await asyncio.gather(*calls)
                for (*_, future), out in zip(batch, outs, strict=True):
                    future.set_result(out)
            except Exception as exc:
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            finally:
                self.running = False
                self.flush()

    settings = LoopSettings(512, 1024, MAX_TURNS)
    return {
        "lock-step": LockStep(engine, tok, StragglerEnv, settings),
        "per-request": PerRequest(engine, tok, StragglerEnv, settings),
    }


def straggler(name: str, backend: str, engine, tok, repeats: int = REPEATS) -> list[tuple]:
    """Table lines: lock-step vs per-request on the straggler workload, best of ``repeats``."""
    from skyrl.inference import run_serving
    from skyrl.inference.base import SamplingParams

    rows = straggler_rows()
    sp = SamplingParams(temperature=1.0, seed=0)
    loops = straggler_loops(engine, tok)
    secs = dict.fromkeys(loops, float("inf"))
    tokens = {}
    for _ in range(repeats + 1):  # the first round warms up
        for what, loop in loops.items():
            t0 = time.perf_counter()
            trajs = run_serving(engine, loop.run(rows, 1, sp))
            elapsed = time.perf_counter() - t0
            if _:
                secs[what] = min(secs[what], elapsed)
            tokens[what] = sum(len(t.response_ids) for tr in trajs for t in tr.turns)
    speedup = secs["lock-step"] / secs["per-request"]
    return [
        (name, backend, what, tokens[what], secs[what], speedup if what == "per-request" else None)
        for what in loops
    ]


def print_straggler_table(lines: list[tuple]) -> None:
    print(
        f"\nStraggler workload: {STRAGGLERS} trajectories x 1-{MAX_TURNS} turns, long-tailed "
        f"turn lengths, every 4th env step {SLOW_ENV_S}s, {os.cpu_count()} CPU threads"
    )
    print(
        f"{'model':<17} {'engine':<6} {'path':<12} {'tokens':>6} {'secs':>6} {'tok/s':>7} {'speedup':>7}"
    )
    for name, eng, what, n, secs, speedup in lines:
        sp = "" if speedup is None else f"{speedup:.2f}x"
        print(f"{name:<17} {eng:<6} {what:<12} {n:>6} {secs:>6.2f} {n / secs:>7.0f} {sp:>7}")


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
    lines, stragglers = [], []
    for name, overrides in MODELS.items():
        path = build_tiny_model(**overrides)
        tok = AutoTokenizer.from_pretrained(path)
        hf = HFEngine(path, max_batch_size=BATCH)
        lines += engine_vs_loop(name, "hf", hf, tok)
        if name == STRAGGLER_MODEL:
            stragglers += straggler(name, "hf", hf, tok)
        hf.shutdown()
        if not args.no_vllm:
            from skyrl.inference.vllm_engine import VLLMEngine

            vl = VLLMEngine(path, kv_cache_memory_bytes=64 << 20, max_model_len=1536)
            if name == STRAGGLER_MODEL:
                stragglers += straggler(name, "vllm", vl, tok)
            lines += engine_vs_loop(name, "vllm", vl, tok)
            vl.shutdown()
    print_straggler_table(stragglers)
    print_table(
        f"Generation, batch {BATCH} x up to {NEW_TOKENS} new tokens, {os.cpu_count()} CPU threads",
        lines,
    )


if __name__ == "__main__":
    main()
