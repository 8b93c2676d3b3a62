"""A model whose layers attend over a sliding window (Mistral's, Gemma3's local layers, Qwen2's
with ``use_sliding_window``) trains on sequences longer than the window: the packed forward
applies the window, shared prompts included, as transformers' own padded sdpa forward does.

Before: ``per_sequence_attention`` raised "a sequence of 16 tokens exceeds the model's sliding
window (8); set trainer.packed_attention=masked" at the first training forward, after the
run had started its engines and generated its first batch."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from worker_helpers import PROMPT_LEN, make_batch

from skyrl.batch import TrainingInputBatch
from skyrl.batch.packing import plan_micro_batches, unpack_to_rows
from skyrl.models import build_tiny_model
from skyrl.workers.logprobs import packed_logprobs
from skyrl.workers.models import load_causal_lm

WINDOW = 8
LENGTHS = [16, 9, 13, 6, 11]  # 16, 9, 13 and 11 are longer than the window
UIDS = ["a", "a", "a", "b", "b"]


def test_window_mask_by_hand():
    from skyrl.workers.packed_attention import _window_mask

    # a shared prompt of 2, a continuation of 3, window 3: the query at position 2 sees
    # positions 0-2, at 3 sees 1-3, at 4 sees 2-4 (keys: the prompt's 0, 1, then 2, 3, 4)
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(_window_mask(2, 3, 3, torch.device("cpu")), expected)


@pytest.fixture(scope="module")
def windowed_model_path() -> str:
    return build_tiny_model(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0)


def padded_logprobs(model, chunk: TrainingInputBatch) -> torch.Tensor:
    """transformers' own forward of the right-padded rows (sdpa, its sliding-window mask)."""
    ids, attention = chunk.input_ids, chunk.attention_mask
    logits = model(input_ids=ids, attention_mask=attention).logits.float()
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([picked.new_zeros(len(chunk), 1), picked], 1) * chunk.loss_mask


@pytest.mark.parametrize("share_prompts", [False, True])
def test_packed_logprobs_and_gradients_apply_the_sliding_window(windowed_model_path, share_prompts):
    chunk = make_batch(windowed_model_path, UIDS, LENGTHS)  # prompts of PROMPT_LEN tokens
    reference = AutoModelForCausalLM.from_pretrained(
        windowed_model_path, dtype=torch.float32, attn_implementation="sdpa"
    )
    assert reference.config.layer_types == ["sliding_attention"] * 2
    expected = padded_logprobs(reference, chunk)
    # the window matters here: the same weights attending to every earlier token differ
    config = reference.config
    config.layer_types, config.sliding_window = ["full_attention"] * 2, None
    unwindowed = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    unwindowed.load_state_dict(reference.state_dict())
    with torch.no_grad():
        assert (padded_logprobs(unwindowed, chunk) - expected).abs().max() > 1e-3

    model = load_causal_lm(windowed_model_path, "fp32")  # packed attention (per_sequence)
    micro = plan_micro_batches(chunk, 64, share_prefixes=share_prompts)
    assert len(micro) == 1
    if share_prompts:  # a's prompt once for its 3 rows, b's once for its 2
        assert micro[0].num_tokens == sum(LENGTHS) - 2 * PROMPT_LEN - PROMPT_LEN
    out = packed_logprobs(model, micro[0], loss_tokens_only=True).logprobs
    actual = unpack_to_rows(micro, [out], len(chunk))
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=0)

    actual.sum().backward()
    expected.sum().backward()
    ref_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        scale = ref_grads[name].grad.abs().max().item()
        torch.testing.assert_close(param.grad, ref_grads[name].grad, atol=4e-6 * scale, rtol=0)
