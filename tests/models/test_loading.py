"""Loaded weights live in the process's own memory, not in a mapping of the file on disk."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from skyrl.inference.hf import HFEngine
from skyrl.models.tiny import build_tiny_model
from skyrl.workers.models import load_causal_lm, load_value_model


def _changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, t in model.state_dict().items() if not torch.equal(t, before[n])]


def test_a_rewrite_of_the_weights_file_leaves_loaded_models_alone(tmp_path):
    """A job that saves over ``model.safetensors`` while a run uses it (same inode: ``open``
    with "wb" or "r+b") must not reach the run's policy, critic, reference or engine.
    The control, plain ``from_pretrained``, shows what they are protected from: transformers
    maps the file, and the rewrite changes the live tensors."""
    path = build_tiny_model(tmp_path / "model")
    engine = HFEngine(path)
    try:
        models = {
            "policy": load_causal_lm(path, "fp32"),
            "critic": load_value_model(path, "fp32"),
            "engine": engine.model,
            "plain from_pretrained": AutoModelForCausalLM.from_pretrained(path),
        }
        before = {k: {n: t.clone() for n, t in m.state_dict().items()} for k, m in models.items()}
        weights = Path(path) / "model.safetensors"
        size = weights.stat().st_size
        with open(weights, "r+b") as f:  # the second half of the tensor data, in place
            f.seek(size // 2)
            f.write(b"\x01" * (size - size // 2))
        changed = {k: _changed(m, before[k]) for k, m in models.items()}
    finally:
        engine.shutdown()
    assert changed.pop("plain from_pretrained"), "transformers no longer maps the file"
    assert changed == {"policy": [], "critic": [], "engine": []}
