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
    _row_spans,
    _sdpa_per_span,
    _varlen_per_span,
    attention_blocks,
    attention_spans,
    per_sequence_attention,
    varlen_kernel,
    varlen_plan,
)

LENGTHS = [10, 1, 7, 12]


def packed_row(vocab: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (1, sum(LENGTHS)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in LENGTHS]).unsqueeze(0)
    return ids, positions


def assert_gradients_close(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Each parameter's gradient equal to the reference's to fp32 rounding of its largest
    entry: the same sums in another order. On an AVX512 EPYC the embedding's gradient (entries
    up to 193, each a sum over the row's tokens) differs by up to 2.7e-4, 1.4e-6 of its
    largest; a wrong attention span moves gradients by a good fraction of theirs."""
    ref_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        expected = ref_grads[name].grad
        scale = expected.abs().max().item()
        torch.testing.assert_close(param.grad, expected, atol=4e-6 * scale, rtol=0, msg=name)


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
    assert_gradients_close(model, reference)


def test_packed_forward_and_gradients_equal_each_sequence_alone(tiny_model_path):
    model = load_causal_lm(tiny_model_path, "fp32", packed_attention="per_sequence")
    assert model.config._attn_implementation == PER_SEQUENCE
    assert_packed_row_equals_each_sequence_alone(model, tiny_model_path)


@pytest.mark.parametrize("mode", ["per_sequence", "masked"])
def test_a_packed_row_longer_than_the_models_context_equals_each_sequence_alone(tmp_path, mode):
    """Each sequence attends only to itself, with its own positions, so the context bounds a
    sequence, not the packed row (``skyrl.batch.budget``): a model with a 12-token context
    runs the 30-token row exactly as its four sequences (10, 1, 7, 12 tokens) alone."""
    from skyrl.models import build_tiny_model

    path = build_tiny_model(tmp_path / "short", max_position_embeddings=max(LENGTHS))
    model = load_causal_lm(path, "fp32", packed_attention=mode)
    assert model.config.max_position_embeddings == 12 < sum(LENGTHS) == 30
    assert_packed_row_equals_each_sequence_alone(model, path)


def assert_packed_row_equals_each_sequence_alone(model: torch.nn.Module, path: str) -> None:
    """``model``'s logits and gradients on ``packed_row()`` equal transformers' eager
    attention run on each sequence alone."""
    ids, positions = packed_row()
    packed = model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False)
    reference = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    alone = torch.cat(
        [reference(input_ids=seq, use_cache=False).logits for seq in ids.split(LENGTHS, 1)], 1
    )
    torch.testing.assert_close(packed.logits, alone, atol=1e-5, rtol=0)
    # the same weighted sum of logits backpropagated through both gives the same gradients
    weights = torch.randn(alone.shape, generator=torch.Generator().manual_seed(0))
    (packed.logits * weights).sum().backward()
    (alone * weights).sum().backward()
    assert_gradients_close(model, reference)


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


def test_a_sequence_over_the_sliding_window_attends_within_the_window():
    """Window 2 over a sequence of 4 (it was refused): query t sees keys t-1 and t only."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, 8, generator=gen)
    k, v = torch.randn(2, 1, 1, 4, 8, generator=gen)
    out, _ = per_sequence_attention(
        torch.nn.Identity(), q, k, v, None, position_ids=torch.arange(4)[None], sliding_window=2
    )
    band = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=band, enable_gqa=True
    )
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-6, rtol=0)


def emulated_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=None):
    """flash-attention's varlen kernel, span by span in SDPA: ``[T, heads, d]`` queries and
    ``[keys, kv_heads, d]`` keys; causal aligned at the bottom right (query ``i`` of a span
    with ``q`` queries and ``k`` keys sees keys up to ``i + k - q``)."""
    cu_q, cu_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    assert cu_seq_q.dtype == cu_seq_k.dtype == torch.int32
    pieces = []
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:], strict=False):
        assert q1 - q0 <= max_q and k1 - k0 <= max_k
        causal = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(k1 - k0 - (q1 - q0))
        out = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(0, 1)[None] for t in (query[q0:q1], key[k0:k1], value[k0:k1])),
            attn_mask=causal,
            scale=scale,
            enable_gqa=True,
        )
        pieces.append(out[0].transpose(0, 1))
    return torch.cat(pieces)


def dense_reference(query, key, value, positions: torch.Tensor, scale: float | None = None):
    """SDPA over the whole row with the mask the spans describe: a query of span
    ``(start, end, prefix_start, prefix)`` sees the prefix keys and, causally, its own."""
    allowed = torch.zeros(query.shape[2], key.shape[2], dtype=torch.bool)
    for start, end, prefix_start, prefix in attention_spans(positions):
        allowed[start:end, prefix_start : prefix_start + prefix] = True
        allowed[start:end, start:end] = torch.ones(end - start, end - start).tril().bool()
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed, scale=scale, enable_gqa=True
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
    "path",
    [
        "cpu_kernels",
        "cpu_kernels_span_by_span",
        "cpu_kernels_blocks_of_5",
        "sdpa_per_span",
        "varlen_emulated",
    ],
)
def test_per_sequence_attention_equals_the_dense_masked_reference(positions, path, monkeypatch):
    """Every path: on CPU torch's flash kernels with a backward of its own (one block, blocks
    of at most 5 queries, every span alone); on a GPU in fp32 SDPA per span with autograd
    through the slices; on a GPU in bf16 the varlen plan (gathered keys, cumulative lengths)
    through a kernel that computes here what flash-attention's varlen kernel computes there
    (``emulated_varlen``): the gather and its gradients are what this checks."""
    block_tokens = {"cpu_kernels_span_by_span": 1, "cpu_kernels_blocks_of_5": 5}
    if path in block_tokens:
        monkeypatch.setattr(packed_attention, "BLOCK_TOKENS", block_tokens[path])
    gen = torch.Generator().manual_seed(0)
    n = len(positions)
    tensors = [torch.randn(1, h, n, 8, generator=gen, requires_grad=True) for h in (4, 2, 2)]
    pos = torch.tensor([positions])
    if path.startswith("cpu_kernels"):
        out, _ = per_sequence_attention(None, *tensors, None, position_ids=pos)
    elif path == "varlen_emulated":
        monkeypatch.setattr(packed_attention, "varlen_kernel", lambda: emulated_varlen)
        out = _varlen_per_span(*tensors, attention_spans(pos[0]), None)
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


def test_varlen_plan_by_hand():
    """Positions [0 1 2 | 2 3]: a 3-token sequence, then a continuation of its first 2 tokens
    with 2 of its own. Keys per span: [0 1 2], then the prompt's [0 1] and its own [3 4]."""
    spans = attention_spans(torch.tensor([0, 1, 2, 2, 3]))
    assert spans == [(0, 3, 0, 0), (3, 5, 0, 2)]
    plan = varlen_plan(tuple(spans), torch.device("cpu"))
    assert plan.gather.tolist() == [0, 1, 2, 0, 1, 3, 4]
    assert plan.cu_seq_q.tolist() == [0, 3, 5] and plan.cu_seq_k.tolist() == [0, 3, 7]
    assert (plan.max_q, plan.max_k) == (3, 4)
    # no prefix anywhere: the keys are the row itself, nothing to gather
    alone = varlen_plan(tuple(attention_spans(torch.tensor([0, 1, 0, 1, 2]))), torch.device("cpu"))
    assert alone.gather is None and alone.cu_seq_k.tolist() == [0, 2, 5] == alone.cu_seq_q.tolist()


def varlen_2_12(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1), enable_gqa=False):  # fmt: skip
    """torch 2.12+'s signature: grouped-query heads and causal through ``window_size``."""
    assert window_size == (-1, 0) and enable_gqa and k.shape[1] < q.shape[1]
    return emulated_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale)


def varlen_2_11(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1)):  # fmt: skip
    """torch 2.11's: no grouped-query heads, so the KV heads come repeated."""
    assert window_size == (-1, 0) and k.shape[1] == v.shape[1] == q.shape[1]
    return emulated_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale)


def varlen_2_10(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.10's: no scale, so not used."""
    raise AssertionError("not to be called")


@pytest.mark.parametrize("signature", [varlen_2_12, varlen_2_11, varlen_2_10])
def test_varlen_kernel_adapts_to_the_torch_versions_signature(signature, monkeypatch):
    """``varlen_kernel`` reads ``varlen_attn``'s signature: with and without ``enable_gqa``
    the row attends like the dense reference (KV heads repeated where it is missing); with
    no ``scale`` there is no kernel (SDPA per span is used)."""
    import torch.nn.attention.varlen as varlen

    monkeypatch.setattr(varlen, "varlen_attn", signature)
    varlen_kernel.cache_clear()
    try:
        kernel = varlen_kernel()
        if signature is varlen_2_10:
            assert kernel is None
            return
        positions = torch.tensor([0, 1, 2, 3, 2, 3, 4, 0, 1])
        gen = torch.Generator().manual_seed(0)
        tensors = [torch.randn(1, h, 9, 8, generator=gen) for h in (4, 2, 2)]
        out = _varlen_per_span(*tensors, attention_spans(positions), 0.5)
        want = dense_reference(*tensors, positions, scale=0.5)
        torch.testing.assert_close(out, want)
    finally:
        varlen_kernel.cache_clear()


def test_this_torchs_varlen_kernel_is_found():
    assert varlen_kernel() is not None  # torch 2.13: varlen_attn with scale and enable_gqa


def test_a_rows_spans_are_read_once_per_forward(monkeypatch):
    """Every layer gets the same position-ids tensor: its spans are computed for the first and
    reused after; a new tensor, or the same one changed in place, is read again."""
    calls = []
    real = packed_attention.attention_spans
    monkeypatch.setattr(packed_attention, "attention_spans", lambda p: calls.append(1) or real(p))
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    for _ in range(3):
        assert _row_spans(positions) == ([(0, 3, 0, 0), (3, 5, 3, 0)], 3)
    assert len(calls) == 1
    positions[0, 3:] = torch.tensor([3, 4])  # in place: one sequence of 5 now
    assert _row_spans(positions) == ([(0, 5, 0, 0)], 5)
    assert _row_spans(positions.clone()) == ([(0, 5, 0, 0)], 5)
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("softcap", 50.0, "softcap=50.0"),  # Gemma2's attn_logit_softcapping
        ("s_aux", torch.zeros(2), "s_aux=<tensor of shape (2,)>"),  # gpt-oss's sinks
        ("sinks", torch.zeros(2), "sinks=<tensor of shape (2,)>"),
        ("is_causal", False, "is_causal=False"),  # bidirectional: always causal here
    ],
)
@pytest.mark.parametrize("padded", [False, True])  # the packed row; a padded batch's sdpa
def test_an_attention_argument_it_does_not_implement_is_refused(name, value, shown, padded):
    # Both paths dropped these in **kwargs and ran plain softmax attention: a Gemma2 or
    # gpt-oss policy computed another model's logprobs (0.198 / 0.672 nats off per sequence)
    q = torch.zeros(1, 2, 4, 8)
    kv = torch.zeros(1, 1, 4, 8)
    mask = torch.ones(1, 4, dtype=torch.long) if padded else None
    with pytest.raises(ValueError) as err:
        per_sequence_attention(
            torch.nn.Identity(),
            q,
            kv,
            kv,
            mask,
            position_ids=torch.arange(4)[None],
            **{name: value},
        )
    assert str(err.value) == (
        f"Identity passes {shown} to its attention, which skyrl's packed attention does not "
        "implement (computed without it, the logprobs would be another model's)"
    )


def test_attention_arguments_that_change_nothing_pass():
    # what transformers hands every layer (use_cache, output flags) and unset options
    gen = torch.Generator().manual_seed(0)
    q, kv = torch.randn(1, 2, 4, 8, generator=gen), torch.randn(1, 1, 4, 8, generator=gen)
    positions = torch.tensor([[0, 1, 0, 1]])
    plain, _ = per_sequence_attention(torch.nn.Identity(), q, kv, kv, None, position_ids=positions)
    quiet = {"use_cache": False, "output_attentions": False, "output_router_logits": False}
    unset = {"softcap": None, "s_aux": None, "is_causal": True}
    out, _ = per_sequence_attention(
        torch.nn.Identity(), q, kv, kv, None, position_ids=positions, **quiet, **unset
    )
    assert torch.equal(out, plain)


def tiny_gemma2():
    from transformers import Gemma2Config

    return Gemma2Config(  # attn_logit_softcapping 50.0 by default
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )


def test_a_gemma2_forward_is_refused_not_computed_without_its_softcap():
    model = AutoModelForCausalLM.from_config(
        tiny_gemma2(), attn_implementation=attention_implementation("per_sequence")
    )
    ids, positions = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[0, 1, 0, 1]])
    with pytest.raises(ValueError, match=r"^Gemma2Attention passes softcap=50.0 to its attention"):
        model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False)


@pytest.mark.parametrize("mode", ["per_sequence", "masked"])
@pytest.mark.parametrize("role", ["policy", "critic"])
def test_loading_a_model_whose_attention_is_not_implemented_is_refused(tmp_path, mode, role):
    # masked hands the layers to transformers' sdpa, which drops Gemma2's softcap silently
    from skyrl.workers.models import load_value_model

    AutoModelForCausalLM.from_config(tiny_gemma2()).save_pretrained(tmp_path)
    load = load_causal_lm if role == "policy" else load_value_model
    with pytest.raises(ValueError) as err:
        load(str(tmp_path), "fp32", packed_attention=mode)
    assert str(err.value) == (
        f"{tmp_path} (gemma2) uses attention logit softcapping (attn_logit_softcapping = 50.0), "
        "which skyrl's packed attention does not implement (nor does transformers' sdpa, "
        "trainer.packed_attention=masked)"
    )
