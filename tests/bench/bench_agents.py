"""An external agent through the OpenAI-compatible endpoint vs the built-in agent loop.

Run: ``python tests/bench/bench_agents.py [--model smollm2|tiny] [--engines hf,vllm]
[--sessions 32] [--turns 3] [--tokens 24] [--repeats 3]``.

The same multi-turn workload on the same engine, both through ``Generator.generate``
(what a training step calls): ``--sessions`` trajectories (8 story prompts x samples)
of ``--turns`` turns of up to ``--tokens`` new tokens each, the user saying "Go on."
between turns, temperature 1 with fixed seeds.

- ``agent_loop``: the built-in ``AgentLoop`` with an env that answers "Go on.".
- ``http``: ``generator.agent`` naming ``go_on_agent`` below, an `openai.AsyncOpenAI`
  agent that sends the whole conversation each turn; every request goes through real
  HTTP on 127.0.0.1, the chat template and the reconciler.

Tokens/s = tokens the engine sampled (loss mask 1) / wall seconds; the modes alternate
``--repeats`` times after a warm-up of each, and the median is reported. Goal: http
within 10% of agent_loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

TOPICS = ["a dragon", "the sea", "a robot", "a lost key", "winter", "a small town", "a cat", "rain"]
GO_ON = "Go on."
TURNS = 3
TOKENS = 24


async def go_on_agent(client, row) -> float:
    """The http mode's agent: ``TURNS`` requests, "Go on." after each reply."""
    messages = [{"role": "user", "content": row.prompt}]
    for turn in range(TURNS):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, max_tokens=TOKENS
        )
        if turn + 1 < TURNS:
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": GO_ON},
            ]
    return 0.0


def go_on_env():
    from skyrl.envs.base import StepResult, TextEnv

    class GoOn(TextEnv):
        """Answers "Go on." until the last turn."""

        def init(self, prompt, extras):
            self.turn = 0
            return super().init(prompt, extras)

        def step(self, action_text):
            self.turn += 1
            if self.turn < TURNS:
                return StepResult([{"role": "user", "content": GO_ON}], 0.0, False)
            return StepResult([], 0.0, True)

    return GoOn()


def main() -> None:
    global TURNS, TOKENS
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    TURNS, TOKENS = args.turns, args.tokens

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    if args.model == "tiny":
        from skyrl.models import build_tiny_model

        path = build_tiny_model()
    else:
        from skyrl.models.resolve import resolve_model_path

        path = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    tok = AutoTokenizer.from_pretrained(path)
    for engine_name in args.engines.split(","):
        if engine_name == "hf":
            from skyrl.inference.hf import HFEngine

            engine = HFEngine(path, max_batch_size=args.sessions)
        else:
            from skyrl.inference.vllm_engine import VLLMEngine

            engine = VLLMEngine(path, kv_cache_memory_bytes=1 << 30, max_model_len=1024)
        compare(args, engine, engine_name, tok)
        engine.shutdown()


def compare(args, engine, engine_name: str, tok) -> None:
    """Both modes on ``engine``, alternating; prints the table."""
    from skyrl.config.generator import HFGeneratorConfig
    from skyrl.data.prompts import PromptRow
    from skyrl.generators import AgentLoop, Generator, LoopSettings
    from skyrl.generators.trajectory import DriverContext, VersionClock
    from skyrl.inference.base import SamplingParams
    from skyrl.serve.harness import HarnessDriver

    samples = max(1, args.sessions // len(TOPICS))
    rows = [
        PromptRow(f"Write a long story about {t}.", "story", {}, uid=f"s{i}")
        for i, t in enumerate(TOPICS[: args.sessions // samples])
    ]
    settings = LoopSettings(256, TURNS * (TOKENS + 32), TURNS, 30.0, TOKENS)
    cfg = HFGeneratorConfig(max_turns=TURNS, max_generate_length=settings.max_generate_length)
    ctx = DriverContext(engine, tok, go_on_env, settings, VersionClock(), cfg)
    drivers = {
        "agent_loop": AgentLoop.from_context(ctx),
        "http": HarnessDriver.from_context(ctx, go_on_agent),
    }
    sampling = SamplingParams(temperature=1.0, seed=0, max_tokens=TOKENS)
    runs: dict[str, list[tuple[int, float, int]]] = {name: [] for name in drivers}
    for repeat in range(args.repeats + 1):  # round 0 warms both up
        for name, driver in drivers.items():
            gen = Generator(driver, engine)
            t0 = time.perf_counter()
            out = gen.generate(rows, samples, sampling)
            secs = time.perf_counter() - t0
            tokens = sum(sum(m) for m in out.loss_masks)
            if repeat:
                runs[name].append((tokens, secs, len(out)))
    drivers["http"].close()

    print(
        f"\n{len(rows) * samples} sessions x {TURNS} turns x up to {TOKENS} tokens, "
        f"{args.model} on {engine_name}, {os.cpu_count()} CPU threads, median of {args.repeats}"
    )
    print(f"{'mode':<11} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'rows':>5}  runs (tok/s)")
    rates = {}
    for name, results in runs.items():
        per_run = [t / s for t, s, _ in results]
        rates[name] = statistics.median(per_run)
        tokens, secs, nrows = results[
            sorted(range(len(per_run)), key=per_run.__getitem__)[len(per_run) // 2]
        ]
        print(
            f"{name:<11} {tokens:>7} {secs:>8.2f} {rates[name]:>7.1f} {nrows:>5}  "
            + " ".join(f"{r:.1f}" for r in per_run)
        )
    print(
        f"http / agent_loop: {rates['http'] / rates['agent_loop']:.3f} (goal >= 0.90)", flush=True
    )


if __name__ == "__main__":
    main()
