"""The GPU attention bench's candidates attend to what ``per_span`` attends to. Their kernels
need a GPU (varlen) or have no CPU backward (flex), so what runs here is what they are given:
flex's mask function over every (query, key) pair, and the varlen plan (gather index and
cumulative lengths) fed to a bottom-right causal SDPA per span, which is what the varlen
kernel computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bench_gpu_attention import (
    CPU_ROWS,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    bench_row,
    dense_mask,
    flex_visibility,
    packed_row,
    varlen_plan,
)

from skyrl.workers.packed_attention import _sdpa_per_span, attention_spans

ROWS = list(CPU_ROWS.values())


@pytest.mark.parametrize("shape", ROWS)
def test_flex_mask_function_is_the_dense_mask(shape):
    positions = packed_row(*shape)
    spans, length = attention_spans(positions), len(positions)
    visible = flex_visibility(spans, length, "cpu")
    queries, keys = torch.arange(length)[:, None], torch.arange(length)[None, :]
    got = visible(0, 0, queries, keys)
    want = dense_mask(spans, length, "cpu")[0, 0]
    assert torch.equal(got, want)
    assert any(prefix for *_, prefix in spans)  # the rows hold shared-prompt continuations


def test_dense_mask_by_hand():
    # positions [0 1 2 | 2 3]: a 3-token sequence, then a continuation of its first 2 tokens
    # (the shared prompt) with its own 2 tokens: queries 3 and 4 see keys 0 and 1, and
    # causally 3 (and 4); never key 2, the first row's own token
    spans = attention_spans(torch.tensor([0, 1, 2, 2, 3]))
    assert spans == [(0, 3, 0, 0), (3, 5, 0, 2)]
    want = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [1, 1, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(dense_mask(spans, 5, "cpu")[0, 0], want)
    plan = varlen_plan(spans, "cpu")
    # keys per span: [0 1 2] then the prompt's [0 1] and the continuation's own [3 4]
    assert plan["gather"].tolist() == [0, 1, 2, 0, 1, 3, 4]
    assert plan["cu_q"].tolist() == [0, 3, 5] and plan["cu_k"].tolist() == [0, 3, 7]
    assert (plan["max_q"], plan["max_k"]) == (3, 4)


@pytest.mark.parametrize("shape", ROWS)
def test_varlen_plan_attends_like_per_span(shape):
    positions = packed_row(*shape)
    spans, length = attention_spans(positions), len(positions)
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(1, HEADS, length, HEAD_DIM, generator=gen)
    key = torch.randn(1, KV_HEADS, length, HEAD_DIM, generator=gen)
    value = torch.randn(1, KV_HEADS, length, HEAD_DIM, generator=gen)
    want = _sdpa_per_span(query, key, value, spans, 0.0, None)[0]  # [T, heads, d]

    plan = varlen_plan(spans, "cpu")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, d]
    k, v = k[plan["gather"]], v[plan["gather"]]
    cu_q, cu_k = plan["cu_q"].tolist(), plan["cu_k"].tolist()
    pieces = []
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:], strict=False):
        causal = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(k1 - k0 - (q1 - q0))
        out = F.scaled_dot_product_attention(
            *(t.transpose(0, 1)[None] for t in (q[q0:q1], k[k0:k1], v[k0:k1])),
            attn_mask=causal,
            enable_gqa=True,
        )
        pieces.append(out[0].transpose(0, 1))
    torch.testing.assert_close(torch.cat(pieces), want, atol=1e-6, rtol=0)


def test_the_bench_runs_on_cpu_and_reports_each_candidate(capsys):
    bench_row("tiny", packed_row(*ROWS[0]), torch.device("cpu"), torch.float32, repeats=1)
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert "MISMATCH" not in rows["per_span"] and "MISMATCH" not in rows["masked"]
    # flex has no CPU backward in torch: its row says it failed and the bench goes on
    assert "failed" in rows["flex"]
