"""Per-sequence attention over a packed row equals each sequence run alone, in value and
gradient (``skyrl.workers.packed_attention``)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl.workers.models import attention_implementation, load_causal_lm
from skyrl.workers.packed_attention import PER_SEQUENCE, per_sequence_attention, sequence_lengths

LENGTHS = [10, 1, 7, 12]


def packed_row(vocab: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (1, sum(LENGTHS)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in LENGTHS]).unsqueeze(0)
    return ids, positions


def test_sequence_lengths_from_position_ids():
    assert sequence_lengths(torch.tensor([0, 1, 2, 0, 0, 1])) == [3, 1, 2]
    assert sequence_lengths(torch.tensor([0, 1, 2, 3])) == [4]
    # a row that starts mid-sequence (no leading 0) still starts a sequence at 0
    assert sequence_lengths(torch.tensor([5, 6, 0, 1])) == [2, 2]


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
