"""CUDA checks (``make test-gpu``; deselected by ``make test``): the hf engine and a DeepSpeed
worker on one GPU over NCCL. Without a GPU these tests FAIL (they are never skipped)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import generate_batch
from skyrl.workers.distributed import find_free_port

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).parents[1] / "workers"))  # worker_helpers


@pytest.fixture(scope="module", autouse=True)
def cuda():
    assert torch.cuda.is_available(), "gpu tests need an NVIDIA GPU (run them with make test-gpu)"


def test_hf_engine_on_cuda_matches_generate_and_forward(tiny_model_path):
    from skyrl.inference.hf import HFEngine

    engine = HFEngine(tiny_model_path, device="cuda")
    prompts = [[5, 9, 13, 2], [7, 3]]
    out = generate_batch(engine, prompts, SamplingParams(n=1, max_tokens=12, temperature=0.0))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).cuda()
    for prompt, (completion,) in zip(prompts, out, strict=True):
        ids = torch.tensor([prompt], device="cuda")
        expected = model.generate(ids, max_new_tokens=12, do_sample=False)[0, len(prompt) :]
        n = len(completion.token_ids)
        assert completion.token_ids == expected[:n].tolist()
        full = torch.tensor([prompt + completion.token_ids], device="cuda")
        logits = model(full).logits[0, len(prompt) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, full[0, len(prompt) :, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(completion.logprobs), lp.cpu(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_deepspeed_worker_on_cuda_trains_and_matches_forward(tiny_model_path, precision):
    """One rank over NCCL: packed forward logprobs equal a padded transformers forward, and one
    mini-batch takes one optimizer step that changes the weights."""
    from worker_helpers import make_batch, make_config, row_logprobs

    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.workers.worker import TrainingWorker

    cfg = make_config(
        tiny_model_path, dp_size=1, precision=precision, num_gpus_per_worker=1,
        policy_mini_batch_size=2,
    )  # fmt: skip
    worker = TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), cfg, 10)
    assert worker.max_tokens == 32768  # unset: grown to the GPU ceiling past the 2048 context
    batch = make_batch(tiny_model_path, ["a", "a", "b", "b"], [16, 9, 13, 6])
    got = worker.forward(batch)["logprobs"].cpu()  # at the loss tokens, 0 elsewhere
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    loss = batch.loss_mask.bool()
    assert got[~loss].abs().sum() == 0
    diff = (got - row_logprobs(model, batch))[loss].abs()
    if precision == "fp32":
        assert diff.max() <= 1e-4, diff.max()
    else:  # bf16 (8-bit mantissa) vs fp32 on logprobs near -6: ~0.02 typical
        assert diff.max() <= 0.1 and diff.mean() <= 0.02, (diff.max(), diff.mean())

    weights = compute_loss_weights("token_mean", batch.loss_mask, batch.metadata["uids"], 16)
    before = {k: v.clone() for k, v in worker.state_dict_for_sync().items()}
    stats = worker.train_mini_batch(batch.replace(loss_weights=weights))
    assert not stats.nonfinite and stats.grad_norm > 0
    assert worker.global_steps() == 1
    after = worker.state_dict_for_sync()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_an_unset_budget_on_a_gpu_grows_to_the_ceiling_that_fits_its_free_memory(tmp_path):
    """A tiny model whose context (16) is its longest sequence: the activation estimate of
    32768 tokens (~0.1 GB) fits any GPU's free memory, so an unset budget is
    ``GPU_MAX_DEFAULT_TOKENS``, past the context (it bounds each sequence, not the row), and
    the step packs all four sequences (36 tokens with shared prompts) into one micro batch;
    a set budget is used as it is."""
    from worker_helpers import make_batch, make_config

    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch.budget import GPU_MAX_DEFAULT_TOKENS
    from skyrl.models.tiny import build_tiny_model
    from skyrl.workers.worker import TrainingWorker

    path = build_tiny_model(tmp_path / "short", max_position_embeddings=16)
    common = dict(dp_size=1, precision="bf16", num_gpus_per_worker=1, policy_mini_batch_size=2)
    worker = TrainingWorker(
        "policy", 0, 1, "127.0.0.1", find_free_port(), make_config(path, **common), 10
    )
    assert worker.max_tokens == GPU_MAX_DEFAULT_TOKENS == 32768
    batch = make_batch(path, ["a", "a", "b", "b"], [16, 9, 13, 6])
    weights = compute_loss_weights("token_mean", batch.loss_mask, batch.metadata["uids"], 16)
    stats = worker.train_mini_batch(batch.replace(loss_weights=weights))
    assert stats.packing.micro_batch_max_tokens == 32768
    assert stats.packing.local_micro_batches == 1
    cfg = make_config(path, micro_batch_max_tokens=96, **common)
    assert TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), cfg, 10).max_tokens == 96


def test_packed_attention_in_bf16_is_one_varlen_call_equal_to_sdpa_per_span(monkeypatch):
    """``per_sequence`` on a GPU in bf16 makes one flash-attention varlen call per row, whose
    output and gradients are SDPA per span's in fp32 to bf16 rounding: at most twice the error
    SDPA per span itself makes in bf16, plus 1e-3. SmolLM2's heads (9 query, 3 KV, dim 64)."""
    from skyrl.workers import packed_attention
    from skyrl.workers.packed_attention import _sdpa_per_span, attention_spans

    kernel = packed_attention.varlen_kernel()
    assert kernel is not None, f"torch {torch.__version__} has no varlen_attn with a scale (2.11+)"
    calls = []
    counted = lambda *args, **kwargs: calls.append(1) or kernel(*args, **kwargs)  # noqa: E731
    monkeypatch.setattr(packed_attention, "varlen_kernel", lambda: counted)
    # a prompt of 40 with its first sample (30), two more samples of it (25, 50), then two
    # sequences alone (100, 64): 309 tokens
    positions = torch.cat(
        [torch.arange(70), torch.arange(40, 65), torch.arange(40, 90), torch.arange(100)]
        + [torch.arange(64)]
    )[None].cuda()
    spans = attention_spans(positions[0])
    assert [prefix for *_, prefix in spans] == [0, 40, 40, 0, 0]
    gen = torch.Generator().manual_seed(0)
    length = positions.shape[1]
    base = [torch.randn(1, heads, length, 64, generator=gen) for heads in (9, 3, 3)]
    grad_out = torch.randn(1, length, 9, 64, generator=gen).cuda()

    def run(dtype, attend):
        tensors = [t.cuda().to(dtype).requires_grad_() for t in base]
        out = attend(*tensors)
        out.backward(grad_out.to(dtype))
        return [out.detach().float(), *(t.grad.float() for t in tensors)]

    def error(got, want):
        return max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))

    per_span = lambda q, k, v: _sdpa_per_span(q, k, v, spans, 0.0, None)  # noqa: E731
    reference = run(torch.float32, per_span)
    floor = error(run(torch.bfloat16, per_span), reference)
    assert calls == []  # SDPA per span never calls it
    got = run(
        torch.bfloat16,
        lambda q, k, v: packed_attention.per_sequence_attention(
            None, q, k, v, None, position_ids=positions
        )[0],
    )
    assert calls == [1]
    assert error(got, reference) <= 2 * floor + 1e-3, (error(got, reference), floor)
