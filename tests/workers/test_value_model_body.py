"""The critic's value model (``load_value_model``): the body of the model at its path with a
zero-initialised scalar head, from a model with its own code too."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from custom_code_model import custom_code_model
from transformers import AutoModelForCausalLM

from skyrl.workers.models import load_value_model


def causal_lm_only(tiny_model_path: str, folder: Path) -> str:
    """The tiny model with its own code whose ``auto_map`` maps a causal LM but no
    ``AutoModel`` (as Qwen-7B's does): a policy transformers loads, with no body class."""
    path = custom_code_model(tiny_model_path, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["auto_map"]["AutoModel"]
    (folder / "config.json").write_text(json.dumps(config))
    return path


def test_a_custom_code_model_without_an_automodel_gives_its_lms_body(tiny_model_path, tmp_path):
    path = causal_lm_only(tiny_model_path, tmp_path / "custom")
    critic = load_value_model(path, "fp32", trust_remote_code=True)

    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=True)
    assert type(critic.body) is type(lm.model)
    ids = torch.tensor([[5, 17, 42, 9, 100]])
    with torch.no_grad():
        values = critic(input_ids=ids)
        hidden = critic.body(input_ids=ids).last_hidden_state
        expected = lm.model(input_ids=ids).last_hidden_state
    # the LM's own body weights: the same hidden states; the head starts at zero: V = 0
    torch.testing.assert_close(hidden, expected, atol=0, rtol=0)
    assert values.shape == (1, 5) and torch.count_nonzero(values) == 0
    assert not any("lm_head" in name for name, _ in critic.named_parameters())
