import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl.batch import TrainingInputBatch, plan_micro_batches, unpack_to_rows
from skyrl.models import build_tiny_model
from skyrl.workers import logprobs as logprobs_module
from skyrl.workers.logprobs import (
    accepts_logits_to_keep,
    loss_predictors,
    packed_logprobs,
    token_logprobs,
)
from skyrl.workers.models import load_causal_lm


def tiny_model() -> torch.nn.Module:
    """The shared tiny random Qwen2 (vocab 512, so ids below 256 are all valid), fp32, SDPA."""
    path = build_tiny_model()
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def reference_logprobs(model, ids: torch.Tensor, temperature: float = 1.0):
    """One sequence alone, no padding: log p(token_t | tokens_<t), 0 at t = 0."""
    logits = model(input_ids=ids[None], use_cache=False).logits[0] / temperature
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    probs = torch.softmax(logits[:-1], -1)
    entropy = -(probs * torch.log_softmax(logits[:-1], -1)).sum(-1)
    return torch.cat([torch.zeros(1), logp]), torch.cat([torch.zeros(1), entropy])


def test_packed_equals_each_sequence_alone():
    model = tiny_model()
    lengths = [7, 1, 12, 5, 9, 3]
    seq_len = 12
    gen = torch.Generator().manual_seed(1)
    attention = (torch.arange(seq_len) < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(0, 256, (len(lengths), seq_len), generator=gen) * attention
    chunk = TrainingInputBatch({"input_ids": ids, "attention_mask": attention})
    micro = plan_micro_batches(chunk, max_tokens=20)
    assert len(micro) > 1 and any(len(mb.row_indices) > 1 for mb in micro)
    with torch.no_grad():
        outs = [packed_logprobs(model, mb, temperature=0.7, compute_entropy=True) for mb in micro]
        logprobs = unpack_to_rows(micro, [o.logprobs for o in outs], len(chunk))
        entropy = unpack_to_rows(micro, [o.entropy for o in outs], len(chunk))
        for row, n in enumerate(lengths):
            ref_lp, ref_ent = reference_logprobs(model, ids[row, :n], temperature=0.7)
            torch.testing.assert_close(logprobs[row, :n], ref_lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(entropy[row, :n], ref_ent, atol=1e-5, rtol=0)
            assert logprobs[row, n:].abs().sum() == 0


def test_packing_is_not_a_no_op():
    """Without restarting positions the packed row would attend across sequences."""
    model = tiny_model()
    ids = torch.randint(1, 256, (2, 6), generator=torch.Generator().manual_seed(2))
    chunk = TrainingInputBatch(
        {"input_ids": ids, "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    )
    (mb,) = plan_micro_batches(chunk, max_tokens=12)
    with torch.no_grad():
        packed = packed_logprobs(model, mb).logprobs[0, 6:]
        crossing = model(input_ids=mb.input_ids, use_cache=False).logits[0, 5:11]
    alone, _ = reference_logprobs(model, ids[1])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
    crossing_lp = torch.log_softmax(crossing[:-1], -1).gather(-1, ids[1, 1:, None])[:, 0]
    assert (crossing_lp - alone[1:]).abs().max() > 1e-3


def test_gradients_flow():
    model = tiny_model().train()
    ids = torch.randint(1, 256, (2, 4), generator=torch.Generator().manual_seed(3))
    chunk = TrainingInputBatch(
        {"input_ids": ids, "attention_mask": torch.ones(2, 4, dtype=torch.long)}
    )
    (mb,) = plan_micro_batches(chunk, max_tokens=8)
    packed_logprobs(model, mb).logprobs.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_a_filler_micro_batch_still_has_a_graph():
    """An empty filler (one dummy token, nothing to predict) must give a loss DeepSpeed can
    backpropagate: a zero with a grad_fn that reaches the parameters."""
    model = tiny_model().train()
    ids = torch.randint(0, 256, (2, 6))
    chunk = TrainingInputBatch({"input_ids": ids, "attention_mask": torch.ones(2, 6).long()})
    *_, filler = plan_micro_batches(chunk, max_tokens=12, num_micro_batches=2)
    assert filler.is_empty
    logprobs = packed_logprobs(model, filler).logprobs
    assert logprobs.grad_fn is not None and float(logprobs.detach().abs().sum()) == 0.0
    (logprobs.sum() * 0.0).backward()
    assert model.model.embed_tokens.weight.grad is not None


def test_shared_prompt_logprobs_equal_each_sequence_alone():
    """Samples of one prompt packed with the prompt once (``share_prefixes``): every row's
    logprobs and entropies are those of its whole sequence alone, including the first
    response token, which the prompt's last position predicts for every row. (The workers'
    attention: transformers' sdpa cannot attend to a shared prompt.)"""
    reference_model = tiny_model()
    model = load_causal_lm(build_tiny_model(), "fp32", packed_attention="per_sequence").eval()
    gen = torch.Generator().manual_seed(4)
    prompt_len, own_lengths, seq_len = 5, [3, 6, 1, 4], 11
    prompt = torch.randint(0, 256, (prompt_len,), generator=gen)
    ids = torch.zeros(len(own_lengths), seq_len, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, n in enumerate(own_lengths):
        ids[row, : prompt_len + n] = torch.cat([prompt, torch.randint(0, 256, (n,), generator=gen)])
        attention[row, : prompt_len + n] = 1
    loss_mask = attention.float()
    loss_mask[:, :prompt_len] = 0
    chunk = TrainingInputBatch(
        {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
    )
    (mb,) = plan_micro_batches(chunk, max_tokens=64, share_prefixes=True)
    assert mb.num_tokens == prompt_len + sum(own_lengths)
    with torch.no_grad():
        out = packed_logprobs(model, mb, temperature=0.7, compute_entropy=True)
    logprobs, entropy = mb.unpack(out.logprobs), mb.unpack(out.entropy)
    for row, n in enumerate(own_lengths):
        length = prompt_len + n
        ref_lp, ref_ent = reference_logprobs(reference_model, ids[row, :length], 0.7)
        torch.testing.assert_close(logprobs[row, :length], ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy[row, :length], ref_ent, atol=1e-5, rtol=0)


def shared_prompt_chunk(prompt_len: int, own_lengths: list[int], seed: int = 5):
    """Rows = one prompt + own continuations; loss on the continuations only."""
    gen = torch.Generator().manual_seed(seed)
    seq_len = prompt_len + max(own_lengths)
    prompt = torch.randint(0, 256, (prompt_len,), generator=gen)
    ids = torch.zeros(len(own_lengths), seq_len, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, n in enumerate(own_lengths):
        ids[row, : prompt_len + n] = torch.cat([prompt, torch.randint(0, 256, (n,), generator=gen)])
        attention[row, : prompt_len + n] = 1
    loss_mask = attention.float()
    loss_mask[:, :prompt_len] = 0
    return TrainingInputBatch(
        {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
    )


def test_loss_tokens_only_projects_only_their_predictors():
    """Prompt 5 shared by rows with 3, 6, 1 and 4 own tokens, all of them loss tokens. Their
    predictors: the prompt's last position (shared by the 4 first response tokens) and each
    row's own positions but its last, (3-1) + (6-1) + (1-1) + (4-1) = 10: the LM head sees 11
    of the 19 packed positions."""
    model = load_causal_lm(build_tiny_model(), "fp32", packed_attention="per_sequence").eval()
    chunk = shared_prompt_chunk(5, [3, 6, 1, 4])
    (mb,) = plan_micro_batches(chunk, max_tokens=64, share_prefixes=True)
    assert mb.num_tokens == 19
    seen: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    with torch.no_grad():
        full = packed_logprobs(model, mb, temperature=0.7, compute_entropy=True)
        kept = packed_logprobs(
            model, mb, 0.7, compute_entropy=True, loss_tokens_only=True, logits_to_keep=True
        )
        picked = packed_logprobs(model, mb, 0.7, compute_entropy=True, loss_tokens_only=True)
    hook.remove()
    assert seen == [19, 11, 19]
    loss = mb.token_fields["loss_mask"] != 0
    assert int(loss.sum()) == 14
    for out in (kept, picked):
        torch.testing.assert_close(out.logprobs[loss], full.logprobs[loss], atol=1e-5, rtol=0)
        torch.testing.assert_close(out.entropy[loss], full.entropy[loss], atol=1e-5, rtol=0)
        assert out.logprobs[~loss].abs().sum() == 0 and out.entropy[~loss].abs().sum() == 0


def test_loss_tokens_only_gives_the_same_gradients():
    """A loss on the loss tokens has the same parameter gradients whether the LM head runs
    at every position or only at the loss tokens' predictors (shared prompt and whole rows)."""
    chunk = shared_prompt_chunk(4, [5, 2, 7], seed=6)
    for share in (True, False):
        micro = plan_micro_batches(chunk, max_tokens=64, share_prefixes=share)
        grads = []
        for only in (False, True):
            model = load_causal_lm(build_tiny_model(), "fp32", packed_attention="per_sequence")
            for mb in micro:
                out = packed_logprobs(model, mb, loss_tokens_only=only, logits_to_keep=only)
                (out.logprobs * mb.token_fields["loss_mask"]).sum().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        for name, grad in grads[0].items():
            torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_a_filler_keeps_a_graph_with_loss_tokens_only():
    model = tiny_model().train()
    chunk = shared_prompt_chunk(3, [2, 2])
    *_, filler = plan_micro_batches(chunk, max_tokens=64, num_micro_batches=2)
    assert filler.is_empty
    assert loss_predictors(filler).tolist() == [0]  # its one token's output, for the graph
    out = packed_logprobs(model, filler, loss_tokens_only=True, logits_to_keep=True).logprobs
    assert out.grad_fn is not None and float(out.detach().abs().sum()) == 0.0
    (out.sum() * 0.0).backward()
    assert model.lm_head.weight.grad is not None


def test_accepts_logits_to_keep_looks_through_wrappers():
    model = tiny_model()

    class Engine(torch.nn.Module):  # DeepSpeed's engine keeps the model as ``.module``
        def __init__(self, module):
            super().__init__()
            self.module = module

    class Plain(torch.nn.Module):
        def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=False):
            raise AssertionError("not called")

    assert accepts_logits_to_keep(model) and accepts_logits_to_keep(Engine(model))
    assert not accepts_logits_to_keep(Engine(Plain()))


def _dense_lookup(model):
    """``model`` with its tied embedding back to a plain ``nn.Embedding`` (the reference)."""
    model.get_input_embeddings().__class__ = torch.nn.Embedding
    return model


def test_a_tied_embedding_adds_its_rows_into_the_heads_gradient():
    """``tied_embedding_row_grads`` (set by ``load_causal_lm`` on CPU) gives the same
    gradients as a plain lookup, the tied one dense (fused AdamW takes no sparse one): for
    micro batches with and without loss tokens, two forwards under one backward, a backward
    that never reaches the LM head, ``torch.autograd.grad`` (which leaves ``.grad`` alone) and
    the padding token's row (no gradient from the lookup). An untied model keeps the plain
    lookup."""
    pad = 7
    path = build_tiny_model(tie_word_embeddings=True, pad_token_id=pad)
    models = {
        "rows": load_causal_lm(path, "fp32").train(),
        "plain": _dense_lookup(load_causal_lm(path, "fp32").train()),
    }
    assert type(models["rows"].get_input_embeddings()) is not torch.nn.Embedding
    assert models["rows"].get_input_embeddings().padding_idx == pad
    ids = torch.randint(1, 256, (2, 6), generator=torch.Generator().manual_seed(5))
    ids[0, 1] = pad
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])  # row 1: no loss token
    chunk = TrainingInputBatch(
        {"input_ids": ids, "attention_mask": torch.ones(2, 6).long(), "loss_mask": loss_mask}
    )
    micro = plan_micro_batches(chunk, max_tokens=6)
    assert len(micro) == 2 and micro[1].token_fields["loss_mask"].sum() == 0

    def forward(model, mb):
        return packed_logprobs(
            model, mb, temperature=0.7, loss_tokens_only=True, logits_to_keep=True
        ).logprobs.sum()

    def through_the_body_only(model):  # the LM head is not in this graph
        return model.model(input_ids=ids[:1]).last_hidden_state.square().mean()

    cases = {
        "one backward per micro batch": lambda m: [forward(m, mb).backward() for mb in micro],
        "two forwards, one backward": lambda m: (
            forward(m, micro[0]) + forward(m, micro[1])
        ).backward(),
        "no LM head": lambda m: through_the_body_only(m).backward(),
    }
    for case, run in cases.items():
        grads = {}
        for kind, model in models.items():
            model.zero_grad(set_to_none=True)
            run(model)
            weight = model.get_input_embeddings().weight
            assert weight.grad is not None and weight.grad.layout == torch.strided, case
            grads[kind] = {n: p.grad.clone() for n, p in model.named_parameters()}
        assert grads["rows"].keys() == grads["plain"].keys()
        for name, grad in grads["rows"].items():
            torch.testing.assert_close(grad, grads["plain"][name], atol=1e-6, rtol=0, msg=case)
        assert not models["rows"].get_input_embeddings().pending, case
    # a change to the padding row comes from the head alone: zero for the body-only loss
    assert grads["rows"]["model.embed_tokens.weight"][pad].abs().max() == 0

    by_grad = {}
    for kind, model in models.items():
        model.zero_grad(set_to_none=True)
        weight = model.get_input_embeddings().weight
        (by_grad[kind],) = torch.autograd.grad(forward(model, micro[0]), [weight])
        assert weight.grad is None
    torch.testing.assert_close(by_grad["rows"].to_dense(), by_grad["plain"], atol=1e-6, rtol=0)

    untied = load_causal_lm(build_tiny_model(), "fp32")
    assert untied.get_output_embeddings().weight is not untied.get_input_embeddings().weight
    assert type(untied.get_input_embeddings()) is torch.nn.Embedding


def test_token_logprobs_by_hand():
    """One row, logits [0, ln 3]: softmax [1/4, 3/4]. It is picked twice: target 0 (log 1/4)
    with upstream gradient 1 and target 1 (log 3/4) with 2. d/d logits = sum over the picks
    of g * (onehot - softmax) = [1, 0] + [0, 2] - (1 + 2) * [1/4, 3/4] = [1/4, -1/4]."""
    logits = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    rows, targets = torch.tensor([0, 0]), torch.tensor([0, 1])
    out = token_logprobs(logits, rows, targets)
    torch.testing.assert_close(out, torch.tensor([math.log(0.25), math.log(0.75)]))
    (out * torch.tensor([1.0, 2.0])).sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[0.25, -0.25]]))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_autograd_log_softmax(temperature, monkeypatch):
    """Values and gradients equal autograd through ``log_softmax`` for rows picked 0, 1 or
    several times, over more rows than one chunk (5 chunks of 3 rows + 2)."""
    monkeypatch.setattr(logprobs_module, "ROW_CHUNK", 3)
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(17, 50, generator=gen) * 4).requires_grad_()
    rows = torch.randint(0, 16, (40,), generator=gen)  # row 16 is never picked
    targets = torch.randint(0, 50, (40,), generator=gen)
    upstream = torch.randn(40, generator=gen)
    got = token_logprobs(logits, rows, targets, temperature)
    (grad,) = torch.autograd.grad(got, logits, upstream)
    want = torch.log_softmax(logits / temperature, -1)[rows, targets]
    (want_grad,) = torch.autograd.grad(want, logits, upstream)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, want_grad, atol=1e-6, rtol=1e-6)
    assert grad[16].abs().sum() == 0


def test_token_logprobs_of_bf16_logits_are_computed_in_fp32():
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(5, 64, generator=gen) * 4).bfloat16().requires_grad_()
    rows, targets = torch.tensor([0, 1, 1, 4]), torch.tensor([3, 9, 60, 0])
    got = token_logprobs(logits, rows, targets, 0.7)
    assert got.dtype == torch.float32
    want = torch.log_softmax(logits.float() / 0.7, -1)[rows, targets]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # same bf16 inputs, fp32 math
    got.sum().backward()
    (want_grad,) = torch.autograd.grad(
        torch.log_softmax(logits.float() / 0.7, -1)[rows, targets].sum(), logits
    )
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad.float(), want_grad.float(), atol=1e-2, rtol=0)


def test_a_confident_bf16_tokens_gradient_is_one_minus_p_not_zero():
    """bf16 logits [6.90625, 0] (6.90625 = 221 * 2^-5 is a bf16 value): e^-6.90625 =
    1e-3 * e^(6.907755 - 6.90625) = 1.00151e-3, p = 1 / (1 + 1.00151e-3) = 0.9989995, so
    d logp_0 / d logits = [1 - p, -(1 - p)] = [1.00050e-3, -1.00050e-3]. Rounded once to bf16
    (8 significant bits: half an ulp is 2^-9 = 0.2% relative) that stays ~1e-3. Adding the
    one-hot 1 to -p already rounded to bf16 (0.9989995 -> 1.0, an ulp there is 2^-8) gives 0."""
    logits = torch.tensor([[6.90625, 0.0]], dtype=torch.bfloat16, requires_grad=True)
    token_logprobs(logits, torch.tensor([0]), torch.tensor([0])).sum().backward()
    one_minus_p = math.exp(-6.90625) / (1 + math.exp(-6.90625))
    assert one_minus_p == pytest.approx(1.00050e-3, rel=1e-5)
    want = torch.tensor([[one_minus_p, -one_minus_p]])
    torch.testing.assert_close(logits.grad.float(), want, rtol=2**-9, atol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_gradients_are_the_exact_gradients_rounded_once(temperature, monkeypatch):
    """Over several chunks (4 rows each), rows picked 0, 1 or several times in no order and
    confident targets (the target's logit 12 above the rest of 64: 1 - p ~ 63 e^-12 = 4e-4),
    the bf16 gradient is the float64 gradient at the same bf16 logits rounded once to bf16:
    within one bf16 ulp (at most 2^-7 relative). fp32's own error in 1 - p, ~ulp(log Z) =
    1e-6 absolute, is ~2.5e-3 of an ulp there. Rounding ``-p * g`` to bf16 before adding
    ``g`` loses the target's ``(1 - p) g`` entirely (100% off)."""
    monkeypatch.setattr(logprobs_module, "ROW_CHUNK", 4)
    gen = torch.Generator().manual_seed(5)
    rows = torch.randint(0, 13, (30,), generator=gen)  # row 13 is never picked
    targets = torch.randint(0, 64, (30,), generator=gen)
    base = torch.randn(14, 64, generator=gen)
    base[rows[::3], targets[::3]] += 12.0 * temperature  # a confident pick in most rows
    logits = base.bfloat16().requires_grad_()
    upstream = torch.randn(30, generator=gen)
    got = token_logprobs(logits, rows, targets, temperature)
    (grad,) = torch.autograd.grad(got, logits, upstream)
    exact = logits.detach().double().requires_grad_()
    want = torch.log_softmax(exact / temperature, -1)[rows, targets]
    (want_grad,) = torch.autograd.grad(want, exact, upstream.double())
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.float(), want_grad.bfloat16().float(), rtol=2**-7, atol=1e-30)
    assert grad[13].abs().sum() == 0


def test_the_entropy_path_and_the_fused_path_give_the_same_gradients():
    """Without entropy ``packed_logprobs`` uses ``token_logprobs``; with it, autograd through
    the chunked log-softmax. The same loss on the logprobs has the same gradients either way
    (shared prompt, temperature 0.7, LM head at the loss tokens only)."""
    chunk = shared_prompt_chunk(4, [5, 2, 7], seed=8)
    (mb,) = plan_micro_batches(chunk, max_tokens=64, share_prefixes=True)
    grads = []
    for entropy in (False, True):
        model = load_causal_lm(build_tiny_model(), "fp32", packed_attention="per_sequence")
        out = packed_logprobs(
            model, mb, 0.7, compute_entropy=entropy, loss_tokens_only=True, logits_to_keep=True
        )
        assert (out.entropy is not None) == entropy
        (out.logprobs * mb.token_fields["loss_mask"]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():  # fp32 rounding: within 1e-6 of each gradient's scale
        scale = float(grad.abs().max())
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6 * scale, rtol=0, msg=name)


class _FixedLogits(torch.nn.Module):
    """Every position's logits are ``row`` (a parameter), over a vocabulary of 3."""

    def __init__(self, row: list[float]):
        super().__init__()
        self.row = torch.nn.Parameter(torch.tensor(row))

    def forward(self, input_ids, **kwargs):
        return SimpleNamespace(logits=self.row.expand(*input_ids.shape, 3))


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_a_masked_vocabulary_entry_adds_nothing_to_the_entropy(temperature):
    """A ``-inf`` logit (a masked vocabulary entry) has probability 0 and adds 0, not
    ``0 x -inf`` = NaN, to the entropy and its gradient, as ``skyrl.algorithms.entropy`` says.
    Logits [0, ln 3, -inf]: at temperature 1, p = [1/4, 3/4, 0] and H = ln 4 - 3/4 ln 3 =
    1.386294 - 0.823959 = 0.562335; at 0.5, [0, 2 ln 3, -inf] gives p = [1/10, 9/10, 0] and
    H = -(0.1 ln 0.1 + 0.9 ln 0.9) = 0.230259 + 0.094824 = 0.325083. dH/dz_i = -p_i (ln p_i +
    H) / T; at T = 1: -1/4 (-1.386294 + 0.562335) = 0.205990 for z_0, -0.205990 for z_1, 0 for
    the masked one; two loss tokens predicted by the same logits: twice that."""
    model = _FixedLogits([0.0, math.log(3.0), float("-inf")])
    ids = torch.tensor([[0, 1, 0]])
    chunk = TrainingInputBatch(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "loss_mask": torch.tensor([[0.0, 1.0, 1.0]]),
        }
    )
    (mb,) = plan_micro_batches(chunk, max_tokens=8)
    out = packed_logprobs(model, mb, temperature, compute_entropy=True, loss_tokens_only=True)
    entropy = {1.0: 0.562335, 0.5: 0.325083}[temperature]
    torch.testing.assert_close(
        out.entropy, torch.tensor([[0.0, entropy, entropy]]), atol=1e-6, rtol=0
    )
    p_1 = {1.0: 0.75, 0.5: 0.9}[temperature]  # token 1's probability
    torch.testing.assert_close(out.logprobs[0, 1], torch.tensor(math.log(p_1)), atol=1e-6, rtol=0)
    out.entropy.sum().backward()
    assert torch.isfinite(model.row.grad).all()
    if temperature == 1.0:
        want = torch.tensor([2 * 0.205990, -2 * 0.205990, 0.0])
        torch.testing.assert_close(model.row.grad, want, atol=1e-5, rtol=0)
