"""GPU benchmark: one training step and generation for a SmolLM2-135M-shaped model on CUDA.

Run: ``python tests/bench/bench_gpu.py`` on a machine with an NVIDIA GPU (prints a note and
exits 0 elsewhere, so ``make bench`` works on CPU machines).

Model: the SmolLM2-135M-Instruct architecture (Llama, hidden 576, 30 layers, 9 heads of 64,
3 KV heads, vocab 49152, tied embeddings), random weights, bf16: throughput does not depend on
the weights. Rows:
- ``hf generate``: ``HFEngine.generate`` at batch B x 64 new tokens after 64-token prompts
  (a sampled EOS can end a row early; tokens/s counts the tokens actually generated).
- ``worker forward`` / ``worker train``: ``TrainingWorker.forward`` and ``train_mini_batch``
  (DeepSpeed ZeRO-0 bf16, one rank over NCCL, packed micro batches of <= 16384 tokens) on
  256 fake rollouts (mean response 256 tokens, at most 1024 per sequence), one optimizer step.
- ``weight sync``: ``state_dict_for_sync`` (gather to CPU) + ``HFEngine.update_weights``.
- ``train at budget B``: the same optimizer step with packed micro batches of <= B tokens
  (``TRAIN_BUDGETS``), and the peak GPU memory of that step: the curve the GPU default of
  ``trainer.micro_batch_max_tokens`` is chosen from.
Figures are the fastest of 3 runs after a warm-up.
"""

from __future__ import annotations

import sys
import tempfile
import time

import torch

SMOLLM2 = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
    rope_theta=100000.0, max_position_embeddings=8192, rms_norm_eps=1e-5,
)  # fmt: skip
PROMPTS, SAMPLES, MAX_SEQ_LEN, BUDGET = 32, 8, 1024, 16384
TRAIN_BUDGETS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def timed(fn, steps: int = 3) -> float:
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def build_model(out: str) -> str:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from skyrl.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    cfg = LlamaConfig(**SMOLLM2, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_config(model_path: str):
    from hydra import compose, initialize_config_module

    from skyrl.config import register_configs
    from skyrl.config.validate import validate

    overrides = [
        f"model.path={model_path}", f"generator.n_samples_per_prompt={SAMPLES}",
        "generator.max_prompt_length=64", f"generator.max_generate_length={BUDGET - 64}",
        "trainer.dp_size=1", "trainer.num_gpus_per_worker=1", "trainer.precision=bf16",
        f"trainer.train_batch_size={PROMPTS}", f"trainer.policy_mini_batch_size={PROMPTS}",
        f"trainer.micro_batch_max_tokens={BUDGET}", "trainer.policy_optimizer.lr=1e-6",
    ]  # fmt: skip
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose("config", overrides=overrides))


def bench_generate(engine, batch: int) -> tuple[float, int]:
    from skyrl.inference import generate_batch
    from skyrl.inference.base import SamplingParams

    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(10, 49000, (batch, 64), generator=gen).tolist()
    sampling = SamplingParams(n=1, max_tokens=64, temperature=1.0, seed=0)
    counted = {}

    def run():
        out = generate_batch(engine, prompts, sampling)
        counted["tokens"] = sum(len(c[0].token_ids) for c in out)

    return timed(run), counted["tokens"]


def main() -> None:
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; run it on a GPU machine")
        return
    from skyrl.algorithms import compute_loss_weights
    from skyrl.inference.hf import HFEngine
    from skyrl.workers.distributed import find_free_port
    from skyrl.workers.fake_rollouts import fake_rollouts
    from skyrl.workers.worker import TrainingWorker

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    path = build_model(tempfile.mkdtemp())
    engine = HFEngine(path, dtype="bfloat16", device="cuda", max_batch_size=256)
    print(f"{'row':<28} {'seconds':>8} {'tokens':>8} {'tokens/s':>10}")
    for batch in (32, 256):
        seconds, tokens = bench_generate(engine, batch)
        print(
            f"{f'hf generate {batch}x64':<28} {seconds:8.2f} {tokens:8d} {tokens / seconds:10.0f}"
        )

    worker = TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), make_config(path), 100)
    rollouts = fake_rollouts(
        PROMPTS, SAMPLES, vocab_size=49152, prompt_len=(16, 64), response_len_mean=256.0,
        response_len_sigma=1.0, max_seq_len=MAX_SEQ_LEN, seed=0,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    rollouts = rollouts.replace(
        old_logprobs=rollouts.rollout_logprobs,
        advantages=torch.randn(len(rollouts), 1, generator=gen) * rollouts.loss_mask,
    )
    weights = compute_loss_weights(
        "token_mean", rollouts.loss_mask, rollouts.metadata["uids"], MAX_SEQ_LEN
    )
    rollouts = rollouts.replace(loss_weights=weights)
    tokens = int(rollouts.attention_mask.sum())
    fwd = timed(lambda: worker.forward(rollouts))
    train = timed(lambda: worker.train_mini_batch(rollouts))
    print(f"{'worker forward':<28} {fwd:8.2f} {tokens:8d} {tokens / fwd:10.0f}")
    print(f"{'worker train (1 opt step)':<28} {train:8.2f} {tokens:8d} {tokens / train:10.0f}")
    sync = timed(lambda: engine.update_weights(worker.state_dict_for_sync()))
    print(f"{'weight sync to hf engine':<28} {sync:8.2f}")
    print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    print(f"{'row':<28} {'seconds':>8} {'tokens':>8} {'tokens/s':>10} {'peak GiB':>9}")
    for budget in TRAIN_BUDGETS:
        worker.max_tokens = budget
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        train = timed(lambda: worker.train_mini_batch(rollouts))
        peak = torch.cuda.max_memory_allocated() / 2**30
        row = f"train at budget {budget}"
        print(f"{row:<28} {train:8.2f} {tokens:8d} {tokens / train:10.0f} {peak:9.1f}")


if __name__ == "__main__":
    sys.exit(main())
