"""Per-sequence attention over a packed row equals each sequence run alone, in value and
gradient (``skyrl.workers.packed_attention``)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl.workers import packed_attention
from skyrl.workers.models import attention_implementation, load_causal_lm
from skyrl.workers.packed_attention import (
    PER_SEQUENCE,
    _sdpa_per_span,
    attention_blocks,
    attention_spans,
    per_sequence_attention,
)

LENGTHS = [10, 1, 7, 12]


def packed_row(vocab: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (1, sum(LENGTHS)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in LENGTHS]).unsqueeze(0)
    return ids, positions


def test_attention_spans_from_position_ids():
    spans = attention_spans(torch.tensor([0, 1, 2, 0, 0, 1]))
    assert spans == [(0, 3, 0, 0), (3, 4, 3, 0), (4, 6, 4, 0)]
    assert attention_spans(torch.tensor([0, 1, 2, 3])) == [(0, 4, 0, 0)]
    # a row that starts mid-sequence (no leading 0) still starts a sequence at 0
    assert attention_spans(torch.tensor([5, 6, 0, 1])) == [(0, 2, 0, 0), (2, 4, 2, 0)]
    # a prompt of 3 shared by three continuations (the first follows it directly), then a
    # plain sequence: the 2nd and 3rd continuations see the prompt [0, 3) as their prefix
    shared = torch.tensor([0, 1, 2, 3, 4, 3, 3, 4, 5, 0, 1])
    assert attention_spans(shared) == [(0, 5, 0, 0), (5, 6, 0, 3), (6, 9, 0, 3), (9, 11, 9, 0)]


@pytest.mark.parametrize("positions", [[0, 1, 4, 5], [0, 1, 0, 3]])
def test_attention_spans_refuse_other_jumps(positions):
    # forward jumps: within a sequence, and right after a new one starts
    with pytest.raises(ValueError, match="position ids jump"):
        attention_spans(torch.tensor(positions))


def test_shared_prompt_forward_and_gradients_equal_each_sequence_alone(tiny_model_path):
    """A prompt packed once with three continuations computes, for every continuation, what
    the whole sequence computes alone; the prompt's logits are the same for all of them."""
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 200, (6,), generator=gen)
    own = [torch.randint(3, 200, (n,), generator=gen) for n in (4, 1, 7)]
    ids = torch.cat([prompt, *own]).unsqueeze(0)
    positions = torch.cat([torch.arange(6), *(torch.arange(6, 6 + len(o)) for o in own)])
    model = load_causal_lm(tiny_model_path, "fp32", packed_attention="per_sequence")
    packed = model(
        input_ids=ids, position_ids=positions[None], attention_mask=None, use_cache=False
    ).logits[0]
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32, attn_implementation="eager"
    )
    alone = [
        reference(input_ids=torch.cat([prompt, o])[None], use_cache=False).logits[0] for o in own
    ]
    own_packed = packed[6:].split([len(o) for o in own])
    for whole, part in zip(alone, own_packed, strict=True):
        torch.testing.assert_close(part, whole[6:], atol=1e-5, rtol=0)
        torch.testing.assert_close(packed[:6], whole[:6], atol=1e-5, rtol=0)
    # a loss on every continuation's own logits and on the prompt's (once per sequence in
    # the reference, so three times its weight in the packed row) gives the same gradients
    weights = [torch.randn(w.shape, generator=gen) for w in alone]
    prompt_weight = sum(w[:6] for w in weights)
    packed_loss = (packed[:6] * prompt_weight).sum() + sum(
        (part * w[6:]).sum() for part, w in zip(own_packed, weights, strict=True)
    )
    packed_loss.backward()
    sum((whole * w).sum() for whole, w in zip(alone, weights, strict=True)).backward()
    ref_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name].grad, atol=1e-4, rtol=1e-4)


def test_packed_forward_and_gradients_equal_each_sequence_alone(tiny_model_path):
    ids, positions = packed_row()
    model = load_causal_lm(tiny_model_path, "fp32", packed_attention="per_sequence")
    assert model.config._attn_implementation == PER_SEQUENCE
    packed = model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False)
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32, attn_implementation="eager"
    )
    alone = torch.cat(
        [reference(input_ids=seq, use_cache=False).logits for seq in ids.split(LENGTHS, 1)], 1
    )
    torch.testing.assert_close(packed.logits, alone, atol=1e-5, rtol=0)
    # the same weighted sum of logits backpropagated through both gives the same gradients
    weights = torch.randn(alone.shape, generator=torch.Generator().manual_seed(0))
    (packed.logits * weights).sum().backward()
    (alone * weights).sum().backward()
    ref_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name].grad, atol=1e-4, rtol=1e-4)


def test_masked_keeps_transformers_sdpa(tiny_model_path):
    assert attention_implementation("masked") == "sdpa"
    model = load_causal_lm(tiny_model_path, "fp32", packed_attention="masked")
    assert model.config._attn_implementation == "sdpa"


def test_a_padded_batch_and_generation_take_plain_sdpa(tiny_model_path):
    """Outside the workers' packed forward (a padded batch, a KV cache) the model computes what
    transformers' sdpa computes."""
    ids, _ = packed_row()
    batch = torch.stack([ids[0, :12], ids[0, 12:24]])
    mask = torch.ones_like(batch)
    mask[1, 8:] = 0  # right padding
    left = torch.ones_like(batch)
    left[0, :3] = 0  # left padding: queries that see no real key stay finite
    ours = load_causal_lm(tiny_model_path, "fp32")
    plain = load_causal_lm(tiny_model_path, "fp32", packed_attention="masked")
    with torch.no_grad():
        for m in (mask, left):
            a = ours(input_ids=batch, attention_mask=m).logits
            b = plain(input_ids=batch, attention_mask=m).logits
            real = m.bool()
            torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)
            assert torch.isfinite(a).all()
        tokens = [ours.generate(batch[:1], max_new_tokens=5, do_sample=False)]
        tokens.append(plain.generate(batch[:1], max_new_tokens=5, do_sample=False))
    assert torch.equal(tokens[0], tokens[1])


def test_a_sequence_over_the_sliding_window_is_refused():
    q = torch.zeros(1, 2, 4, 8)
    kv = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="sliding window"):
        per_sequence_attention(
            torch.nn.Identity(),
            q,
            kv,
            kv,
            None,
            position_ids=torch.arange(4)[None],
            sliding_window=2,
        )


def dense_reference(query, key, value, positions: torch.Tensor):
    """SDPA over the whole row with the mask the spans describe: a query of span
    ``(start, end, prefix_start, prefix)`` sees the prefix keys and, causally, its own."""
    allowed = torch.zeros(query.shape[2], key.shape[2], dtype=torch.bool)
    for start, end, prefix_start, prefix in attention_spans(positions):
        allowed[start:end, prefix_start : prefix_start + prefix] = True
        allowed[start:end, start:end] = torch.ones(end - start, end - start).tril().bool()
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed, enable_gqa=True
    ).transpose(1, 2)


@pytest.mark.parametrize(
    "positions",
    [
        [0, 1, 2, 3, 4, 3, 3, 4, 5, 0, 1],  # a prompt of 3 shared by 3 rows, then a sequence
        # the last row's prefix (3 tokens) runs past its sequence's first span (2 tokens)
        [0, 1, 1, 2, 3, 3, 4],
    ],
)
@pytest.mark.parametrize(
    "path", ["cpu_kernels", "cpu_kernels_span_by_span", "cpu_kernels_blocks_of_5", "sdpa_per_span"]
)
def test_per_sequence_attention_equals_the_dense_masked_reference(positions, path, monkeypatch):
    """Both paths: on CPU torch's flash kernels with a backward of its own (one block, blocks
    of at most 5 queries, every span alone), elsewhere (CUDA) SDPA per span with autograd
    through the slices."""
    block_tokens = {"cpu_kernels_span_by_span": 1, "cpu_kernels_blocks_of_5": 5}
    if path in block_tokens:
        monkeypatch.setattr(packed_attention, "BLOCK_TOKENS", block_tokens[path])
    gen = torch.Generator().manual_seed(0)
    n = len(positions)
    tensors = [torch.randn(1, h, n, 8, generator=gen, requires_grad=True) for h in (4, 2, 2)]
    pos = torch.tensor([positions])
    if path.startswith("cpu_kernels"):
        out, _ = per_sequence_attention(None, *tensors, None, position_ids=pos)
    else:
        out = _sdpa_per_span(*tensors, attention_spans(pos[0]), 0.0, None)
    ref = dense_reference(*tensors, pos[0])
    torch.testing.assert_close(out, ref)
    weights = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * weights).sum(), tensors)
    ref_grads = torch.autograd.grad((ref * weights).sum(), tensors)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_attention_blocks_by_hand():
    """Positions 0-4, then two continuations of its first 3 tokens ([3] and [3, 4, 5]), then a
    new sequence [0, 1]. Spans: (0, 5), (5, 6) and (6, 9) with prefix [0, 3), (9, 11)."""
    spans = attention_spans(torch.tensor([0, 1, 2, 3, 4, 3, 3, 4, 5, 0, 1]))
    assert spans == [(0, 5, 0, 0), (5, 6, 0, 3), (6, 9, 0, 3), (9, 11, 9, 0)]
    seen = float("-inf")

    (whole,) = attention_blocks(spans, max_tokens=96)
    assert (whole.start, whole.end, whole.key_ranges) == (0, 11, ((0, 11),))
    allowed = whole.mask == 0
    assert torch.equal(allowed[:5, :5], torch.ones(5, 5).tril().bool())
    assert allowed[5].nonzero().flatten().tolist() == [0, 1, 2, 5]
    for row, own in ((6, [6]), (7, [6, 7]), (8, [6, 7, 8])):
        assert allowed[row].nonzero().flatten().tolist() == [0, 1, 2, *own]
    assert allowed[9].nonzero().flatten().tolist() == [9]
    assert allowed[10].nonzero().flatten().tolist() == [9, 10]
    assert set(whole.mask.unique().tolist()) == {0.0, seen}

    # at most 5 queries: (0, 5) alone; (5, 6) + (6, 9) = 4 queries; (9, 11) alone
    first, middle, last = attention_blocks(spans, max_tokens=5)
    assert (first.start, first.end, first.key_ranges, first.mask) == (0, 5, ((0, 5),), None)
    assert (last.start, last.end, last.key_ranges, last.mask) == (9, 11, ((9, 11),), None)
    # the middle block's keys: the prefix [0, 3) then its own [5, 9): local 0-2, then 3-6
    assert (middle.start, middle.end, middle.key_ranges) == (5, 9, ((0, 3), (5, 9)))
    allowed = middle.mask == 0
    assert allowed[0].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert allowed[1].nonzero().flatten().tolist() == [0, 1, 2, 4]
    assert allowed[3].nonzero().flatten().tolist() == [0, 1, 2, 4, 5, 6]
