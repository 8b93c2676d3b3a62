"""Benchmark of the DeepSpeed policy worker on CPU: packed vs padded training, weight sync.

Run: ``python tests/bench/bench_workers.py`` (2-3 minutes on 2 cores; starts its own Ray).

Data: ``fake_rollouts`` with 8 prompts x 4 samples, prompt 16-64 tokens, log-normal
responses (mean 128, sigma 1, clipped so a sequence is at most 1024 tokens): a long
tail, as in real RL rollouts. Model: a random Qwen2, hidden 256, 4 layers, 4 heads
of 64 (2 KV), vocab ~470, fp32. Each row is one mini-batch (all 32 sequences, one optimizer
step, ppo loss, token_mean weights); warm-up step first, then the fastest of STEPS steps
(the machine is shared: the minimum is the least noisy).
Training tokens/s counts REAL tokens only (attention mask), so padding shows as waste.

Rows:
- ``worker packed dp=1``: ``WorkerGroup.train_mini_batch`` (Ray call, DeepSpeed ZeRO-0,
  token-budget packed micro batches of <= 1024 tokens, 2 torch threads).
- ``worker packed dp=2``: the same with 2 ranks x 1 thread (both cores).
- ``in-process padded k=4``: plain transformers + torch AdamW in this process, 2 threads,
  the same model and rows; fixed-count micro batches of 4 consecutive rows, each
  right-padded to its longest row (what a fixed ``micro_batch_size`` trainer does).
- ``state_dict_for_sync``: the worker method, timed inside the rank-0 actor (no Ray
  transfer), vs ``torch.clone`` of one flat tensor of the same byte count in that actor.
"""

from __future__ import annotations

import os
import time

import ray
import torch
from hydra import compose, initialize_config_module
from transformers import AutoConfig, AutoModelForCausalLM

from skyrl.algorithms import POLICY_LOSSES, compute_loss_weights
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.config import register_configs
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.config.validate import validate
from skyrl.dispatch import MeshDispatch
from skyrl.models.tiny import build_tiny_model
from skyrl.workers.fake_rollouts import fake_rollouts
from skyrl.workers.group import WorkerGroup

PROMPTS, SAMPLES, MAX_SEQ_LEN, BUDGET, PADDED_K, STEPS = 8, 4, 1024, 1024, 4, 3
MODEL = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)


def make_batch(vocab_size: int) -> TrainingInputBatch:
    batch = fake_rollouts(
        PROMPTS, SAMPLES, vocab_size=vocab_size, prompt_len=(16, 64), response_len_mean=128.0,
        response_len_sigma=1.0, max_seq_len=MAX_SEQ_LEN, seed=0,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    advantages = torch.randn(len(batch), 1, generator=gen) * batch.loss_mask
    return batch.replace(old_logprobs=batch.rollout_logprobs, advantages=advantages)


def make_config(model_path: str, dp_size: int):
    overrides = [
        f"model.path={model_path}", f"generator.n_samples_per_prompt={SAMPLES}",
        "generator.max_prompt_length=64", f"generator.max_generate_length={MAX_SEQ_LEN - 64}",
        f"trainer.dp_size={dp_size}", f"trainer.num_cpus_per_worker={2 // dp_size}",
        f"trainer.train_batch_size={PROMPTS}", f"trainer.policy_mini_batch_size={PROMPTS}",
        f"trainer.micro_batch_max_tokens={BUDGET}", "trainer.zero_stage=0",
        "trainer.policy_optimizer.lr=1e-5",
    ]  # fmt: skip
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose("config", overrides=overrides))


def weights_fn(mb: TrainingInputBatch) -> torch.Tensor:
    return compute_loss_weights("token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN)


def timed(fn, steps: int = STEPS) -> float:
    fn()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_worker(model_path: str, batch: TrainingInputBatch, dp_size: int):
    group = WorkerGroup("policy", make_config(model_path, dp_size), total_optimizer_steps=100)
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], PROMPTS, PROMPTS)
    (chunks,) = MeshDispatch.stage_chunks(dp_size, batch, bounds, loss_weights_fn=weights_fn)
    records = []

    def step():
        records.append(group.train_mini_batch(chunks))

    try:
        seconds = timed(step)
        sync = group.actors[0].__ray_call__.remote(_time_sync_in_actor) if dp_size == 1 else None
        sync_times = ray.get(sync) if sync is not None else None
    finally:
        group.shutdown()
    micro, real = records[-1].packing.local_micro_batches, records[-1].packing.local_tokens
    return seconds, int(micro), real / (micro * BUDGET), sync_times


def _time_sync_in_actor(worker) -> tuple[float, float, int]:
    """Runs inside the rank-0 actor: (state_dict_for_sync s, clone of the same bytes s, bytes)."""
    nbytes = sum(p.numel() * p.element_size() for p in worker.engine.module.parameters())
    flat = torch.empty(nbytes, dtype=torch.uint8)
    flat.fill_(1)
    sync = timed(worker.state_dict_for_sync, steps=5)
    clone = timed(lambda: torch.clone(flat), steps=5)
    return sync, clone, nbytes


def bench_padded(model_path: str, batch: TrainingInputBatch) -> tuple[float, int, float]:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    weighted = batch.replace(loss_weights=weights_fn(batch))
    micro = [weighted[i : i + PADDED_K] for i in range(0, len(batch), PADDED_K)]
    padded_tokens = sum(int(mb.real_lengths().max()) * len(mb) for mb in micro)
    cfg = AlgorithmConfig()

    def step():
        for mb in micro:
            width = int(mb.real_lengths().max())
            rows = TrainingInputBatch(
                {k: v[:, :width] for k, v in mb.tensors.items() if v.dim() == 2}
            )
            logits = model(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits
            ids = rows.input_ids
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            logprobs = torch.cat([lp.new_zeros(len(rows), 1), lp], 1)
            loss, _ = POLICY_LOSSES.get("ppo")(
                logprobs, rows.old_logprobs, rows.advantages, rows.loss_weights,
                rows.loss_mask, cfg, rows.rollout_logprobs,
            )  # fmt: skip
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return timed(step), len(micro), int(batch.real_lengths().sum()) / padded_tokens


def main() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    model_path = build_tiny_model(**MODEL)
    batch = make_batch(AutoConfig.from_pretrained(model_path).vocab_size)
    tokens = int(batch.real_lengths().sum())
    lengths = batch.real_lengths()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        rows = []
        for dp in (1, 2):
            seconds, micro, fill, sync = bench_worker(model_path, batch, dp)
            rows.append((f"worker packed dp={dp} (<= {BUDGET} tok)", seconds, micro, fill))
            if sync is not None:
                sync_times = sync
        seconds, micro, fill = bench_padded(model_path, batch)
        rows.append((f"in-process padded k={PADDED_K} rows", seconds, micro, fill))
    finally:
        ray.shutdown()

    print(__doc__.split("Rows:")[0].strip().splitlines()[0])
    print(
        f"{len(batch)} sequences, {tokens} real tokens (lengths min {int(lengths.min())}, "
        f"median {int(lengths.median())}, max {int(lengths.max())}), fastest of {STEPS} steps"
    )
    print(
        f"{'training (one mini-batch step)':38s} {'s/step':>8s} {'tok/s':>8s} {'micro':>6s} {'fill':>6s}"
    )
    for name, seconds, micro, fill in rows:
        print(f"{name:38s} {seconds:8.2f} {tokens / seconds:8.0f} {micro:6d} {fill:6.2f}")
    sync_s, clone_s, nbytes = sync_times
    print(f"{'weight sync (rank-0 actor, 5 calls)':38s} {'ms':>8s} {'GB/s':>8s}")
    print(f"{'state_dict_for_sync':38s} {sync_s * 1e3:8.1f} {nbytes / sync_s / 1e9:8.2f}")
    print(
        f"{f'torch.clone of {nbytes / 1e6:.1f} MB':38s} {clone_s * 1e3:8.1f} {nbytes / clone_s / 1e9:8.2f}"
    )


if __name__ == "__main__":
    main()
