"""``TrainingWorker.active_dropout`` leaves out the dropout of heads a causal LM does not run.

GPT-NeoX (Pythia) configs carry ``classifier_dropout=0.1``, read only by its token- and
sequence-classification heads, and GPT-2's ``summary_first_dropout`` is its double-heads
model's: the causal LM's training forward computes exactly its eval forward. They were
counted as dropout in the training forward, so every step of such a run took its old
logprobs from a separate forward (the start-up line: "a separate forward (dropout in the
policy's training forward: config.classifier_dropout=0.1)").
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPTNeoXConfig

from skyrl.workers.worker import TrainingWorker


def active_dropout(model: torch.nn.Module) -> list[str]:
    return TrainingWorker.active_dropout(SimpleNamespace(engine=SimpleNamespace(module=model)))


def train_equals_eval(model: torch.nn.Module) -> bool:
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained = model.train()(ids).logits
        evaluated = model.eval()(ids).logits
    return torch.equal(trained, evaluated)


def test_a_classifier_dropout_is_not_the_causal_lms():
    config = GPTNeoXConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128,
    )  # fmt: skip
    assert config.classifier_dropout == 0.1
    model = AutoModelForCausalLM.from_config(config)
    assert train_equals_eval(model)
    assert active_dropout(model) == []
    model.config.attention_dropout = 0.1  # the causal LM's own: still found
    assert active_dropout(model) == ["config.attention_dropout=0.1"]


def test_a_summary_heads_dropout_is_not_the_causal_lms():
    small = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=2, n_positions=64)
    off = GPT2Config(**small, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    assert off.summary_first_dropout == 0.1
    model = AutoModelForCausalLM.from_config(off)
    assert train_equals_eval(model)
    assert active_dropout(model) == []
    on = AutoModelForCausalLM.from_config(GPT2Config(**small))  # GPT-2's defaults: 0.1 each
    found = active_dropout(on)
    assert "config.resid_pdrop=0.1" in found and "config.attn_pdrop=0.1" in found
    assert not any("summary" in f for f in found)
