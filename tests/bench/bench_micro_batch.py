"""Training tokens/s of the SmolLM2 policy worker against the micro-batch token budget.

Run: ``python tests/bench/bench_micro_batch.py`` (about 5 minutes on 2 cores; starts its own
Ray). The work of the TRL comparison (issue 18): 4 prompts x 4 samples, prompts of 30-60
tokens, log-normal responses of at most 48 tokens; SmolLM2-135M-Instruct fp32, one
mini-batch = one optimizer step (ppo loss, token_mean). Each budget: one warm-up step, then
the fastest of ``STEPS``. ``trainer.micro_batch_max_tokens`` = 108 is one sequence's maximum
(the old bound); above it a micro batch packs several sequences, each attending only to
itself: per sequence (``trainer.packed_attention=per_sequence``) or through a block-diagonal
mask over the packed row (``masked``). Layouts: 2 ranks x 1 thread and 1 rank x 2 threads.
Tokens/s counts real tokens. Also prints the machine's fp32 matmul peak (2 threads).
"""

from __future__ import annotations

import os

import ray
import torch
from bench_trl import cpu_model, fp32_peak_gflops
from bench_workers import timed
from hydra import compose, initialize_config_module
from transformers import AutoConfig

from skyrl.algorithms import compute_loss_weights
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.dispatch import MeshDispatch
from skyrl.models.smollm2 import ensure_converted
from skyrl.workers.fake_rollouts import fake_rollouts
from skyrl.workers.group import WorkerGroup

PROMPTS, SAMPLES, PROMPT_LEN, RESPONSE_LEN, STEPS = 4, 4, 60, 48, 2
MAX_SEQ_LEN = PROMPT_LEN + RESPONSE_LEN
BUDGETS = (MAX_SEQ_LEN, 256, 512, 1024, 2048)
CASES = [
    *((2, 1, "per_sequence", b) for b in BUDGETS),
    *((2, 1, "masked", b) for b in (MAX_SEQ_LEN, 512, 1024)),
    *((1, 2, "per_sequence", b) for b in (MAX_SEQ_LEN, 512, 1024, 2048)),
]
"""(dp_size, torch threads per rank, trainer.packed_attention, micro_batch_max_tokens)."""


def make_batch(vocab_size: int) -> TrainingInputBatch:
    batch = fake_rollouts(
        PROMPTS, SAMPLES, vocab_size=vocab_size, prompt_len=(30, PROMPT_LEN),
        response_len_mean=30.0, response_len_sigma=0.5, max_seq_len=MAX_SEQ_LEN, seed=0,
    )  # fmt: skip
    advantages = torch.randn(len(batch), 1, generator=torch.Generator().manual_seed(0))
    return batch.replace(
        old_logprobs=batch.rollout_logprobs, advantages=advantages * batch.loss_mask
    )


def make_config(
    model_path: str, dp_size: int, threads: int, attention: str, budget: int, precision: str
):
    overrides = [
        f"model.path={model_path}", f"generator.n_samples_per_prompt={SAMPLES}",
        f"generator.max_prompt_length={PROMPT_LEN}", f"generator.max_generate_length={RESPONSE_LEN}",
        f"trainer.dp_size={dp_size}", f"trainer.num_cpus_per_worker={threads}",
        f"trainer.train_batch_size={PROMPTS}", f"trainer.policy_mini_batch_size={PROMPTS}",
        f"trainer.micro_batch_max_tokens={budget}", "trainer.policy_optimizer.lr=1e-5",
        f"trainer.packed_attention={attention}", f"trainer.precision={precision}",
    ]  # fmt: skip
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose("config", overrides=overrides))


def bench(
    model_path: str,
    batch: TrainingInputBatch,
    case: tuple[int, int, str, int],
    precision: str = "fp32",
):
    dp_size = case[0]
    cfg = make_config(model_path, *case, precision)
    group = WorkerGroup("policy", cfg, total_optimizer_steps=100)
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], PROMPTS, PROMPTS)

    def weights(mb: TrainingInputBatch) -> torch.Tensor:
        return compute_loss_weights("token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN)

    (chunks,) = MeshDispatch.stage_chunks(dp_size, batch, bounds, loss_weights_fn=weights)
    records = []
    try:
        seconds = timed(lambda: records.append(group.train_mini_batch(chunks)), steps=STEPS)
    finally:
        group.shutdown()
    return seconds, int(records[-1].packing.local_micro_batches)


def main() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    model_path = str(ensure_converted())
    batch = make_batch(AutoConfig.from_pretrained(model_path).vocab_size)
    tokens = int(batch.real_lengths().sum())
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows = []
    try:
        for case in CASES:
            seconds, micro = bench(model_path, batch, case)
            rows.append((*case, seconds, micro))
            print(f"  {case}: {seconds:.2f} s", flush=True)
    finally:
        ray.shutdown()
    print(__doc__.splitlines()[0])
    print(f"{len(batch)} sequences, {tokens} real tokens; fastest of {STEPS} steps")
    print(f"CPU: {cpu_model()}; fp32 matmul peak {fp32_peak_gflops():.1f} GFLOP/s (2 threads)")
    print(
        f"{'layout':18s} {'attention':13s} {'budget':>7s} {'s/step':>8s} {'tok/s':>7s} {'micro':>6s}"
    )
    for dp_size, threads, attention, budget, seconds, micro in rows:
        layout = f"dp {dp_size} x {threads} thread(s)"
        print(
            f"{layout:18s} {attention:13s} {budget:7d} {seconds:8.2f} {tokens / seconds:7.0f} {micro:6d}"
        )


if __name__ == "__main__":
    main()
