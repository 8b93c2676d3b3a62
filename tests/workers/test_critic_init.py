"""The critic's value head (``load_value_model``): from the checkpoint's own one-output head
(a reward model's ``score``, TRL's ``v_head.summary``) when it has one, else zeros."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForSequenceClassification

from skyrl.workers.models import load_value_model

IDS = torch.tensor([[5, 17, 42, 9, 100]])


def _hidden(path: str) -> torch.Tensor:
    """The body's last hidden states for ``IDS``, (5, 64)."""
    with torch.no_grad():
        return AutoModel.from_pretrained(path).eval()(input_ids=IDS).last_hidden_state[0]


def _values(path: str) -> torch.Tensor:
    with torch.no_grad():
        return load_value_model(path, "fp32")(input_ids=IDS)[0]


def test_a_critic_from_a_reward_model_starts_from_its_score_head(tiny_model_path, tmp_path, capsys):
    # a reward model: the tiny LM's body + score = Linear(64, 1, bias=False), saved sharded
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    with torch.no_grad():
        rm.score.weight.copy_(torch.linspace(-1.0, 1.0, 64).unsqueeze(0))
    path = str(tmp_path / "rm")
    rm.save_pretrained(path, max_shard_size="100KB")
    assert (Path(path) / "model.safetensors.index.json").is_file()
    capsys.readouterr()

    values = _values(path)
    assert "critic: value head initialised from score.weight of " + path in capsys.readouterr().out

    # V[t] = sum_i w_i h[t, i] with w_i = -1 + 2i/63 (no bias: the score head has none)
    h, w = _hidden(path), torch.linspace(-1.0, 1.0, 64)
    for t in (0, 2, 4):
        assert abs(float(values[t]) - float((w * h[t]).sum())) < 1e-5
    # the reward model scores a sequence at its last token: V there is its reward
    with torch.no_grad():
        reward = rm.eval()(input_ids=IDS).logits[0, 0]
    torch.testing.assert_close(values[-1], reward, atol=1e-5, rtol=0)


def test_a_trl_value_head_with_a_bias_is_taken_too(tiny_model_path, tmp_path, capsys):
    path = tmp_path / "trl"
    shutil.copytree(tiny_model_path, path)
    weights = load_file(path / "model.safetensors")
    weights["v_head.summary.weight"] = torch.full((1, 64), 0.5)
    weights["v_head.summary.bias"] = torch.tensor([3.0])
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()

    values = _values(str(path))
    assert "from v_head.summary.weight and v_head.summary.bias of" in capsys.readouterr().out
    # V[t] = 0.5 * sum_i h[t, i] + 3
    h = _hidden(str(path))
    for t in (1, 3):
        assert abs(float(values[t]) - (0.5 * float(h[t].sum()) + 3.0)) < 1e-5


def test_a_classifier_or_a_plain_lm_gives_a_fresh_head(tiny_model_path, tmp_path, capsys):
    classifier = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=2)
    path = str(tmp_path / "classifier")
    classifier.save_pretrained(path)
    capsys.readouterr()

    assert torch.count_nonzero(_values(path)) == 0
    assert (
        f"critic: score.weight of {path} has shape (2, 64), not (1, 64) (one output): not a "
        "value head; the value head starts at zero"
    ) in capsys.readouterr().out

    assert torch.count_nonzero(_values(tiny_model_path)) == 0
    assert "critic:" not in capsys.readouterr().out
