"""``load_causal_lm`` refuses a checkpoint without LM-head weights (a reward model, a bare
transformer body), which transformers would load with a randomly initialised head."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from skyrl.models.tiny import build_tiny_model
from skyrl.workers.models import load_causal_lm


@pytest.mark.parametrize("kind", ["reward_model", "body"])
def test_a_policy_from_a_checkpoint_without_an_lm_head_is_refused(kind, tiny_model_path, tmp_path):
    # before: Qwen2ForCausalLM loaded with lm_head.weight random (a "MISSING" load report)
    path = str(tmp_path / kind)
    if kind == "reward_model":
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    else:
        model = AutoModel.from_pretrained(tiny_model_path)
    model.save_pretrained(path)
    with pytest.raises(ValueError) as err:
        load_causal_lm(path, "fp32")
    assert str(err.value) == (
        f"model.path={path} has no weights for Qwen2ForCausalLM's LM head (lm_head.weight): "
        "not a causal LM (a reward model, a bare transformer body?); a reward model can start "
        "the critic (trainer.critic_model_path)"
    )


def test_a_tied_lm_head_is_not_missing(tmp_path):
    path = build_tiny_model(tmp_path / "tied", tie_word_embeddings=True)
    model = load_causal_lm(path, "fp32")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.count_nonzero(model.lm_head.weight) > 0
