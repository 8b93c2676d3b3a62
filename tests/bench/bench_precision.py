"""fp32 vs bf16 on this machine's CPU: matmul speed, a policy training step, the logprob gap.

Run: ``python tests/bench/bench_precision.py`` (2 threads). Prints the CPU and its
AMX-BF16 and AVX512-BF16 flags, then GFLOP/s of torch matmuls in fp32, in bf16 and in fp32
under ``torch.autocast("cpu", torch.bfloat16)``. Where bf16 has native kernels (either flag,
or a probe at least half fp32's speed), it also times a SmolLM2-135M policy training step
(``trainer.precision`` fp32 vs bf16: bf16 weights, fp32 master weights; the work of
``bench_micro_batch.py``: 16 sequences, 1 rank x 2 threads, a 2048-token budget) and
measures the logprob gap between the bf16 model and the fp32 model on that batch (what
``rollout/logprob_abs_diff`` shows with an fp32 engine and a bf16 trainer). Without either,
bf16 falls back to slow kernels (below 1 GFLOP/s measured on an AVX2 EPYC): those rows are
skipped and say why. The last line says what ``trainer.precision=auto`` picks here.
"""

from __future__ import annotations

import os

import torch
from bench_trl import cpu_model, matmul_gflops

THREADS = 2
SHAPES = ((1024, 576, 1536), (2048, 2048, 2048))
"""(m, k, n): a SmolLM2 MLP projection on 1024 tokens, and a square one."""
PROBE = (256, 256, 256)
"""A small product timed first in bf16: a slow fallback shows here in milliseconds."""
PROBE_REPEATS = 10
"""Best of this many: on an AVX512-BF16 EPYC a best of 3 once read 8.4 GFLOP/s in bf16, where
the same product runs at 280-340 (one slow stretch of the host), and judged a fallback."""


def matmul_table(bf16_flag: bool) -> bool:
    """Print the matmul rows; True when bf16 has native kernels here: the CPU says so
    (``bf16_flag``) or the probe runs at least half as fast as fp32."""
    probe_fp32 = matmul_gflops(*PROBE, torch.float32, False, repeats=PROBE_REPEATS)
    probe_bf16 = matmul_gflops(*PROBE, torch.bfloat16, False, repeats=PROBE_REPEATS)
    fast = bf16_flag or probe_bf16 >= 0.5 * probe_fp32
    print(f"{'matmul (m x k x n)':22s} {'fp32':>8s} {'bf16':>8s} {'autocast':>9s}  GFLOP/s")
    print(f"{'x'.join(map(str, PROBE)):22s} {probe_fp32:8.1f} {probe_bf16:8.1f} {'':>9s}")
    for shape in SHAPES:
        fp32 = matmul_gflops(*shape, torch.float32, False, repeats=3)
        if fast:
            bf16 = f"{matmul_gflops(*shape, torch.bfloat16, False, repeats=3):8.1f}"
            auto = f"{matmul_gflops(*shape, torch.float32, True, repeats=3):9.1f}"
        else:  # seconds per product at the fallback's speed: not run
            bf16, auto = f"{'-':>8s}", f"{'-':>9s}"
        print(f"{'x'.join(map(str, shape)):22s} {fp32:8.1f} {bf16} {auto}")
    if not fast:
        print(
            f"bf16 runs at {probe_bf16 / probe_fp32:.3f}x fp32 on the probe: a slow fallback "
            "(no AMX-BF16 / AVX512-BF16 flag); the larger bf16 products and the training step "
            "are not run"
        )
    return fast


def training_rows() -> None:
    """A policy training step in fp32 and in bf16, and the bf16-vs-fp32 logprob gap."""
    import ray
    from bench_micro_batch import MAX_SEQ_LEN, PROMPTS, bench, make_batch
    from transformers import AutoConfig, AutoModelForCausalLM

    from skyrl.models.smollm2 import ensure_converted

    model_path = str(ensure_converted())
    batch = make_batch(AutoConfig.from_pretrained(model_path).vocab_size)
    tokens = int(batch.real_lengths().sum())
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        rows = {
            precision: bench(model_path, batch, (1, 2, "per_sequence", 2048), precision)[0]
            for precision in ("fp32", "bf16")
        }
    finally:
        ray.shutdown()
    print(f"training step, {PROMPTS * 4} sequences, {tokens} real tokens, fastest of 2")
    for precision, seconds in rows.items():
        print(f"  {precision}: {seconds:6.2f} s/step {tokens / seconds:7.0f} tok/s")
    print(f"  bf16 speedup: {rows['fp32'] / rows['bf16']:.2f}x")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = batch.input_ids[:, :MAX_SEQ_LEN]
    mask = batch.attention_mask[:, :MAX_SEQ_LEN]
    with torch.no_grad():
        fp32 = torch.log_softmax(model(ids, attention_mask=mask).logits.float(), -1)
        bf16 = torch.log_softmax(
            model.to(torch.bfloat16)(ids, attention_mask=mask).logits.float(), -1
        )
    taken = ids[:, 1:, None]
    gap = (fp32[:, :-1].gather(-1, taken) - bf16[:, :-1].gather(-1, taken)).abs()[..., 0]
    real = mask[:, 1:].bool()
    print(
        f"  logprob gap bf16 vs fp32 model on the batch's tokens: mean {gap[real].mean():.4f}, "
        f"max {gap[real].max():.4f} nats"
    )


def main() -> None:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import skyrl
    from skyrl.config.validate import validate

    torch.set_num_threads(THREADS)
    capabilities = torch.cpu.get_capabilities()
    amx = bool(capabilities.get("amx_bf16", False))
    avx512 = bool(capabilities.get("avx512_bf16", False))
    print(__doc__.splitlines()[0])
    print(f"CPU: {cpu_model()}; amx_bf16: {amx}; avx512_bf16: {avx512}; {THREADS} threads")
    if matmul_table(amx or avx512):
        training_rows()
    picked = validate(skyrl.compose(["trainer.precision=auto"])).trainer.precision
    print(f"trainer.precision=auto picks: {picked}")


if __name__ == "__main__":
    main()
