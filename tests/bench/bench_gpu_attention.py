"""Attention over a packed micro batch on the GPU: which way of keeping each sequence to itself
is fastest (issue 18 asks for it on CPU and on the GPU path; CPU: ``bench_micro_batch.py`` and
``skyrl.workers.packed_attention``'s docstring).

Run: ``python tests/bench/bench_gpu_attention.py`` on a machine with an NVIDIA GPU (bf16), or
``--device cpu`` (fp32, smaller rows, no ``varlen``: a check of the candidates' arithmetic, not
a timing that means anything for the GPU).

One layer of SmolLM2's attention (9 query heads, 3 KV heads, head dim 64) on one packed row
``[1, T]`` laid out by the workers' own packer (``plan_micro_batches``, prompts shared):
- ``per_span``: what ``per_sequence`` runs on a GPU in fp32 or without ``varlen_attn``
  (``_sdpa_per_span``): one SDPA call per sequence, and per shared-prompt continuation with
  the prompt's keys joined before its own;
- ``masked``: one SDPA call over the row with a ``[T, T]`` mask (what ``masked`` does; every
  block is computed);
- ``cpu_blocks`` (``--device cpu`` only): what ``per_sequence`` runs on CPU
  (``_CpuSpanAttention``): torch's CPU flash kernels called once per block of short
  consecutive spans, with a backward of its own;
- ``varlen``: what ``per_sequence`` runs on a GPU in bf16 (``_varlen_per_span``): torch's
  ``varlen_attn``, flash-attention's varlen kernel, one call per row; a continuation's keys
  are its prompt's (gathered) then its own, causal aligned at the bottom right;
- ``flex``: ``flex_attention`` under ``torch.compile`` with a block mask built from the spans
  (the first call's compile time is printed apart);
- ``padded``: padded rows of similar-length sequences (the third way issue 18 names): the
  spans sorted by key length into buckets of lengths within a factor of two, each bucket one
  SDPA call over a ``[spans, heads, longest, d]`` batch (a continuation's keys its prompt's
  then its own) with a mask of each row's real keys, causal at the bottom right. It pads only
  inside attention: a model fed padded rows would also run its matmuls on the padding.

Each figure is forward + backward (gradients of query, key and value), the median of
``--repeats`` after warm-up, per layer; ``plan ms`` is what a candidate builds once per micro
batch and every layer shares (the dense mask, the key gather index, the block mask). Outputs
and gradients are compared with ``per_span`` in fp32: ``max err`` is the largest absolute
difference, beside ``per_span``'s own in the bench's dtype (the rounding floor); a candidate
whose error exceeds twice that floor plus 1e-3 is marked MISMATCH and is not a result.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from skyrl.batch.packing import plan_micro_batches
from skyrl.workers.fake_rollouts import fake_rollouts
from skyrl.workers.packed_attention import (
    _CpuSpanAttention,
    _sdpa_per_span,
    _varlen_per_span,
    attention_spans,
    varlen_plan,
)

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
"""SmolLM2-135M's attention shapes."""
SCALE = HEAD_DIM**-0.5
ROWS = {
    # name: (prompts, samples, prompt_len, response mean, max_seq_len, micro_batch_max_tokens)
    "bench-trl (4x4, <=108)": (4, 4, (30, 60), 30.0, 108, 2048),
    "bench_gpu (32x8, <=1024)": (32, 8, (16, 64), 256.0, 1024, 16384),
}
CPU_ROWS = {
    "bench-trl (4x4, <=108)": ROWS["bench-trl (4x4, <=108)"],
    "4 prompts x 4, <=256": (4, 4, (16, 64), 96.0, 256, 2048),
}


def packed_row(prompts, samples, prompt_len, mean, max_seq_len, budget) -> torch.Tensor:
    """The first packed micro batch's position ids ``[T]`` for fake rollouts of this shape."""
    batch = fake_rollouts(
        prompts, samples, vocab_size=1000, prompt_len=prompt_len, response_len_mean=mean,
        response_len_sigma=1.0, max_seq_len=max_seq_len, seed=0,
    )  # fmt: skip
    return plan_micro_batches(batch, budget, share_prefixes=True)[0].position_ids[0]


Spans = list[tuple[int, int, int, int]]


def dense_mask(spans: Spans, length: int, device) -> torch.Tensor:
    """``[1, 1, T, T]`` bool: each span's queries see their prefix and, causally, themselves."""
    seen = torch.zeros(length, length, dtype=torch.bool)
    for start, end, prefix_start, prefix in spans:
        seen[start:end, start:end] = torch.ones(end - start, end - start).tril().bool()
        seen[start:end, prefix_start : prefix_start + prefix] = True
    return seen.to(device)[None, None]


def fresh_varlen_plan(spans: Spans, device) -> Spans:
    """Build the varlen plan anew (``_varlen_per_span`` then finds it in ``varlen_plan``'s
    cache, as every layer after the first does) and hand on the spans."""
    varlen_plan.cache_clear()
    varlen_plan(tuple(spans), device)
    return spans


def flex_visibility(spans: Spans, length: int, device) -> Callable:
    """flex's mask function: a query sees keys from its own start up to itself, and its
    prefix (per-token bounds looked up by the query's index)."""
    own_start = torch.empty(length, dtype=torch.long)
    prefix_lo, prefix_hi = (
        torch.zeros(length, dtype=torch.long),
        torch.zeros(length, dtype=torch.long),
    )
    for start, end, prefix_start, prefix in spans:
        own_start[start:end] = start
        prefix_lo[start:end], prefix_hi[start:end] = prefix_start, prefix_start + prefix
    own_start, prefix_lo, prefix_hi = (t.to(device) for t in (own_start, prefix_lo, prefix_hi))

    def visible(batch, head, q, k):
        return ((k >= own_start[q]) & (k <= q)) | ((k >= prefix_lo[q]) & (k < prefix_hi[q]))

    return visible


def flex_plan(spans: Spans, length: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    visible = flex_visibility(spans, length, device)
    return create_block_mask(visible, None, None, length, length, device=str(device))


class PaddedBucket(NamedTuple):
    """Spans of similar key length, as one padded SDPA batch."""

    queries: torch.Tensor
    """long ``[spans, longest query]``: each span's query positions in the row, padded with 0."""
    keys: torch.Tensor
    """long ``[spans, longest key list]``: its prefix's positions then its own, padded with 0."""
    mask: torch.Tensor
    """bool ``[spans, 1, longest query, longest key list]``: query i of a span with a prefix
    of p sees its keys 0..p+i (its prompt, then its own up to itself); a padded query sees
    key 0 only, so its row stays finite (its output is dropped)."""
    real: torch.Tensor
    """long: the real queries' places in the flattened ``[spans * longest query]`` output."""


class PaddedPlan(NamedTuple):
    buckets: list[PaddedBucket]
    order: torch.Tensor
    """long ``[T]``: where row position t sits in the buckets' real outputs, concatenated."""


def padded_plan(spans: Spans, device) -> PaddedPlan:
    """The ``padded`` candidate's buckets: spans sorted by key-list length (prefix + own),
    a new bucket wherever the length exceeds twice the bucket's shortest."""
    by_keys = sorted(spans, key=lambda span: span[3] + span[1] - span[0])
    groups: list[Spans] = []
    for span in by_keys:
        keys = span[3] + span[1] - span[0]
        if groups and keys <= 2 * (groups[-1][0][3] + groups[-1][0][1] - groups[-1][0][0]):
            groups[-1].append(span)
        else:
            groups.append([span])
    buckets, placed = [], []
    for group in groups:
        longest_q = max(end - start for start, end, _, _ in group)
        longest_k = max(prefix + end - start for start, end, _, prefix in group)
        queries = torch.zeros(len(group), longest_q, dtype=torch.long)
        keys = torch.zeros(len(group), longest_k, dtype=torch.long)
        mask = torch.zeros(len(group), 1, longest_q, longest_k, dtype=torch.bool)
        mask[:, :, :, 0] = True
        real = []
        for row, (start, end, prefix_start, prefix) in enumerate(group):
            own = torch.arange(start, end)
            queries[row, : end - start] = own
            keys[row, : prefix + end - start] = torch.cat(
                [torch.arange(prefix_start, prefix_start + prefix), own]
            )
            sees = torch.arange(longest_k)[None, :] <= prefix + torch.arange(end - start)[:, None]
            mask[row, 0, : end - start] = sees
            real.append(row * longest_q + torch.arange(end - start))
            placed.append(own)
        buckets.append(
            PaddedBucket(
                queries.to(device), keys.to(device), mask.to(device), torch.cat(real).to(device)
            )
        )
    order = torch.empty(sum(len(p) for p in placed), dtype=torch.long)
    order[torch.cat(placed)] = torch.arange(len(order))
    return PaddedPlan(buckets, order.to(device))


def padded(q, k, v, plan: PaddedPlan, scale: float) -> torch.Tensor:
    """One SDPA call per bucket; the real queries' outputs put back in row order:
    ``[1, T, heads, d]``."""
    outputs = []
    for bucket in plan.buckets:
        qb = q[0][:, bucket.queries].transpose(0, 1)  # [spans, heads, longest query, d]
        kb, vb = (t[0][:, bucket.keys].transpose(0, 1) for t in (k, v))
        out = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=bucket.mask, scale=scale, enable_gqa=True
        )
        outputs.append(out.transpose(1, 2).flatten(0, 1)[bucket.real])
    return torch.cat(outputs)[plan.order][None]


def per_span(q, k, v, spans: Spans, scale: float) -> torch.Tensor:
    return _sdpa_per_span(q, k, v, spans, 0.0, scale)


def cpu_blocks(q, k, v, spans: Spans, scale: float) -> torch.Tensor:
    """What ``per_sequence`` runs on CPU: flash calls per block of short spans."""
    return _CpuSpanAttention.apply(q, k, v, spans, scale).transpose(1, 2)


def candidates(device: torch.device) -> dict[str, tuple[Callable, Callable]]:
    """name -> (build the per-micro-batch plan from (spans, T), attend(q, k, v, plan, scale))."""
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    found = {
        "per_span": (lambda spans, length: spans, per_span),
        "masked": (
            lambda spans, length: dense_mask(spans, length, device),
            lambda q, k, v, mask, scale: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=scale, enable_gqa=True
            ).transpose(1, 2),
        ),
        "flex": (
            lambda spans, length: flex_plan(spans, length, device),
            lambda q, k, v, mask, scale: flex(
                q, k, v, block_mask=mask, scale=scale, enable_gqa=True
            ).transpose(1, 2),
        ),
        "padded": (lambda spans, length: padded_plan(spans, device), padded),
    }
    if device.type == "cuda":
        found["varlen"] = (lambda spans, length: fresh_varlen_plan(spans, device), _varlen_per_span)
    else:
        found["cpu_blocks"] = (lambda spans, length: spans, cpu_blocks)
    return found


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def fwd_bwd(attend, inputs, plan, grad_out, scale):
    q, k, v = (t.detach().requires_grad_() for t in inputs)
    out = attend(q, k, v, plan, scale)
    out.backward(grad_out)
    return out.detach(), (q.grad, k.grad, v.grad)


def timed_ms(fn, device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def max_error(got, want) -> float:
    out, grads = got
    ref_out, ref_grads = want
    pairs = [(out, ref_out), *zip(grads, ref_grads, strict=True)]
    return max(float((a.float() - b.float()).abs().max()) for a, b in pairs)


def bench_row(name: str, positions: torch.Tensor, device, dtype, repeats: int) -> None:
    spans = attention_spans(positions)
    length = len(positions)
    gen = torch.Generator().manual_seed(0)

    def head_major(heads):  # [1, heads, T, d] over a [1, T, heads, d] buffer, as in the model
        return torch.randn(1, length, heads, HEAD_DIM, generator=gen).transpose(1, 2)

    base = [head_major(HEADS), head_major(KV_HEADS), head_major(KV_HEADS)]
    grad_cpu = torch.randn(1, length, HEADS, HEAD_DIM, generator=gen)
    reference = fwd_bwd(per_span, [t.to(device) for t in base], spans, grad_cpu.to(device), SCALE)
    inputs = [t.to(device, dtype) for t in base]
    grad_out = grad_cpu.to(device, dtype)
    prompts = len({s[2] for s in spans if s[3]})
    print(
        f"\n{name}: T={length} tokens, {len(spans)} spans ({prompts} shared prompts), "
        f"{device.type} {str(dtype).removeprefix('torch.')}"
    )
    print(f"{'attention':<10} {'fwd+bwd ms':>10} {'plan ms':>8} {'x30 + plan ms':>13} "
          f"{'max err':>9} {'first call s':>12}")  # fmt: skip
    floor = None
    for label, (build, attend) in candidates(device).items():
        try:
            run_ms, plan_ms, error, first_s = measure(
                build, attend, spans, inputs, grad_out, reference, device, repeats
            )
        except Exception as exc:  # a candidate this torch or device lacks is a row, not a stop
            print(f"{label:<10} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            continue
        floor = error if label == "per_span" else floor
        verdict = "" if error <= 2 * (floor or 0.0) + 1e-3 else "  MISMATCH"
        print(
            f"{label:<10} {run_ms:10.2f} {plan_ms:8.2f} {30 * run_ms + plan_ms:13.1f} "
            f"{error:9.2e} {first_s:12.1f}{verdict}"
        )


def measure(build, attend, spans, inputs, grad_out, reference, device, repeats):
    """(fwd+bwd ms, plan ms, max error against the fp32 reference, first call s)."""
    length = inputs[0].shape[2]
    start = time.perf_counter()
    plan = build(spans, length)
    error = max_error(fwd_bwd(attend, inputs, plan, grad_out, SCALE), reference)
    sync(device)
    first_s = time.perf_counter() - start
    run_ms = timed_ms(lambda: fwd_bwd(attend, inputs, plan, grad_out, SCALE), device, repeats)
    plan_ms = timed_ms(lambda: build(spans, length), device, min(repeats, 5))
    return run_ms, plan_ms, error, first_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else None)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if args.device is None:
        print("bench_gpu_attention: no CUDA device here; run it on a GPU machine (or --device cpu)")
        return
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, shape in (ROWS if device.type == "cuda" else CPU_ROWS).items():
        bench_row(name, packed_row(*shape), device, dtype, args.repeats)


if __name__ == "__main__":
    main()
