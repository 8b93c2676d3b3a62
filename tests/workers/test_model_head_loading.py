"""What the loaders do with a model folder that is no causal LM, and what they say: the hf
engine refuses a checkpoint without LM-head weights (as the policy worker does) rather than
serve a random head; the critic says where its value head came from once, on rank 0."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from transformers import AutoModel, AutoModelForSequenceClassification

from skyrl.inference.hf import HFEngine
from skyrl.workers.models import load_value_model


@pytest.mark.parametrize("kind", ["body", "reward_model"])
def test_the_hf_engine_refuses_a_checkpoint_without_an_lm_head(kind, tiny_model_path, tmp_path):
    # before: Qwen2ForCausalLM loaded with lm_head.weight random (a "MISSING" load report)
    path = str(tmp_path / kind)
    if kind == "body":
        model = AutoModel.from_pretrained(tiny_model_path)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    model.save_pretrained(path)
    with pytest.raises(ValueError) as err:
        HFEngine(path, tokenizer_path=tiny_model_path)
    assert str(err.value) == (
        f"model.path={path} has no weights for Qwen2ForCausalLM's LM head (lm_head.weight): "
        "not a causal LM (a reward model, a bare transformer body?); a reward model can start "
        "the critic (trainer.critic_model_path)"
    )


def test_the_hf_engine_still_loads_a_causal_lm(tiny_model_path):
    engine = HFEngine(tiny_model_path)
    try:
        assert type(engine.model).__name__ == "Qwen2ForCausalLM"
    finally:
        engine.shutdown()


@pytest.mark.parametrize("rank", [0, 1])
def test_the_critic_says_where_its_head_came_from_on_rank_0_only(
    rank, tiny_model_path, tmp_path, capsys, monkeypatch
):
    # before: every critic rank printed it (dp_size 2: the line twice)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    path = str(tmp_path / "rm")
    rm.save_pretrained(path)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    capsys.readouterr()

    critic = load_value_model(path, "fp32")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("critic:")]
    expected = [f"critic: value head initialised from score.weight of {path}"]
    assert said == (expected if rank == 0 else [])
    # every rank starts from the reward model's head all the same
    assert critic.value_head.weight.tolist() == rm.score.weight.tolist()
