"""The GPU attention bench's masks attend to what ``per_span`` attends to. flex has no CPU
backward, so what runs here is its mask function over every (query, key) pair; the varlen
path is the library's (``tests/workers/test_packed_attention.py``)."""

from __future__ import annotations

import pytest
import torch
from bench_gpu_attention import (
    CPU_ROWS,
    bench_row,
    dense_mask,
    flex_visibility,
    packed_row,
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


def test_the_bench_runs_on_cpu_and_reports_each_candidate(capsys):
    bench_row("tiny", packed_row(*ROWS[0]), torch.device("cpu"), torch.float32, repeats=1)
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert "MISMATCH" not in rows["per_span"] and "MISMATCH" not in rows["masked"]
    # flex has no CPU backward in torch: its row says it failed and the bench goes on
    assert "failed" in rows["flex"]
