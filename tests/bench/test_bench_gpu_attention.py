"""The GPU attention bench's masks attend to what ``per_span`` attends to. flex has no CPU
backward, so what runs here is its mask function over every (query, key) pair; the varlen
path is the library's (``tests/workers/test_packed_attention.py``)."""

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
    padded,
    padded_plan,
)

from skyrl.workers.packed_attention import attention_spans

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


def test_padded_plan_by_hand():
    # spans (0, 3) with no prefix (3 keys) and (3, 5) after a prefix of 2 (4 keys): 4 <= 2 x 3,
    # one bucket, padded to 3 queries and 4 keys
    spans = attention_spans(torch.tensor([0, 1, 2, 2, 3]))
    plan = padded_plan(spans, "cpu")
    (bucket,) = plan.buckets
    assert bucket.queries.tolist() == [[0, 1, 2], [3, 4, 0]]
    assert bucket.keys.tolist() == [[0, 1, 2, 0], [0, 1, 3, 4]]
    # the first span sees its keys up to itself; the second's query i sees its prompt's 2
    # keys and its own up to itself (keys 0..2+i); its third query is padding: key 0 only
    assert bucket.mask[:, 0].int().tolist() == [
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]],
        [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]],
    ]
    assert bucket.real.tolist() == [0, 1, 2, 3, 4]  # row 1's real queries at 1 x 3 + (0, 1)
    assert plan.order.tolist() == [0, 1, 2, 3, 4]


def test_padded_buckets_put_outputs_back_in_row_order():
    # a 9-token sequence (9 keys) and a 2-token one (2 keys): 9 > 2 x 2, two buckets, the short
    # one first, so the row's positions 9 and 10 come first in the buckets' outputs
    positions = torch.tensor([*range(9), 0, 1])
    spans = attention_spans(positions)
    plan = padded_plan(spans, "cpu")
    assert [b.queries.tolist() for b in plan.buckets] == [[[9, 10]], [list(range(9))]]
    assert plan.order.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, 11, HEAD_DIM, generator=gen)
    k, v = (torch.randn(1, KV_HEADS, 11, HEAD_DIM, generator=gen) for _ in range(2))
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=dense_mask(spans, 11, "cpu"), enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(padded(q, k, v, plan, HEAD_DIM**-0.5), want)


def test_the_bench_runs_on_cpu_and_reports_each_candidate(capsys):
    bench_row("tiny", packed_row(*ROWS[0]), torch.device("cpu"), torch.float32, repeats=1)
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    for name in ("per_span", "masked", "padded", "cpu_blocks"):
        assert "MISMATCH" not in rows[name] and "failed" not in rows[name], rows[name]
    # flex has no CPU backward in torch: its row says it failed and the bench goes on
    assert "failed" in rows["flex"]
