"""A model whose attention layer takes ``position_ids`` and does not pass them on to the
attention function (Ministral 3's, Persimmon's) keeps packed sequences apart: the packed
attention takes the position ids the model's forward was called with.

Before: ``per_sequence_attention`` got ``position_ids=None``, took the packed row for one
sequence (plain causal sdpa), and the sequences attended to each other: a tiny Ministral 3's
second packed sequence was 0.54 off its logits alone, Persimmon's too, silently."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from worker_helpers import packed_after_another_gap

from skyrl.workers.models import load_causal_lm, load_value_model

SHAPE = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def saved_model(tmp_path, model_type: str) -> str:
    config = CONFIG_MAPPING[model_type](**SHAPE)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / model_type)
    return str(tmp_path / model_type)


IDS = torch.randint(0, 100, (1, 20), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("model_type", ["ministral3", "persimmon"])
def test_packed_sequences_stay_apart_when_the_attention_drops_position_ids(tmp_path, model_type):
    path = saved_model(tmp_path, model_type)
    assert packed_after_another_gap(load_causal_lm(path, "fp32"), IDS) < 1e-5


def test_the_critic_body_keeps_them_apart_too(tmp_path):
    critic = load_value_model(saved_model(tmp_path, "ministral3"), "fp32")
    with torch.no_grad():
        critic.value_head.weight.normal_(generator=torch.Generator().manual_seed(2))
        positions = torch.cat([torch.arange(10), torch.arange(10)])[None]
        packed = critic(input_ids=IDS, position_ids=positions, attention_mask=None)[0, 10:]
        alone = critic(input_ids=IDS[:, 10:], position_ids=positions[:, 10:])[0]
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
