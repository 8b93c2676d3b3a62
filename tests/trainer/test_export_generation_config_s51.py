"""``export_checkpoint_hf`` (``skyrl-eval`` of a checkpoint) built the exported model with
``from_config``, whose generation config comes from ``config.json`` alone: the base's
``generation_config.json`` was dropped. A base whose EOS ids are a list beyond
``config.json``'s (Qwen2.5-Instruct's ``<|endoftext|>``) exported with one EOS id, so the
engines evaluating it (they stop at the generation config's EOS ids) generated past a stop
the trained model and the run's ``final_hf`` stop at; the base's sampling defaults were
lost too. A base without the file still exports with the one derived from its config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from skyrl.trainer.checkpoint import export_checkpoint_hf


def checkpoint_of(base: Path, ckpt: Path) -> Path:
    """A ZeRO <= 2 checkpoint layout holding ``base``'s weights, each + 1 ("trained")."""
    model = AutoModelForCausalLM.from_pretrained(base)
    state = ckpt / "policy" / "state"
    state.mkdir(parents=True)
    weights = {k: v + 1 for k, v in model.state_dict().items()}
    torch.save({"module": weights}, state / "mp_rank_00_model_states.pt")
    return ckpt


def test_the_base_generation_config_goes_with_the_export(tiny_model_path, tmp_path):
    torch.set_num_threads(1)
    base = tmp_path / "base"
    shutil.copytree(tiny_model_path, base)
    eos = json.loads((base / "config.json").read_text())["eos_token_id"]
    assert isinstance(eos, int)
    extra_eos = eos + 3
    GenerationConfig(
        eos_token_id=[eos, extra_eos], pad_token_id=0, do_sample=True, temperature=0.6, top_p=0.9
    ).save_pretrained(base)
    out = export_checkpoint_hf(checkpoint_of(base, tmp_path / "ckpt"), str(base), str(base),
                               tmp_path / "out")  # fmt: skip
    exported = AutoModelForCausalLM.from_pretrained(out).generation_config
    assert exported.eos_token_id == [eos, extra_eos]  # was eos alone
    assert (exported.do_sample, exported.temperature, exported.top_p) == (True, 0.6, 0.9)


def test_a_base_without_a_generation_config_exports_the_derived_one(tiny_model_path, tmp_path):
    torch.set_num_threads(1)
    base = tmp_path / "base"
    shutil.copytree(tiny_model_path, base)
    (base / "generation_config.json").unlink()
    eos = json.loads((base / "config.json").read_text())["eos_token_id"]
    out = export_checkpoint_hf(checkpoint_of(base, tmp_path / "ckpt"), str(base), str(base),
                               tmp_path / "out")  # fmt: skip
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert exported.generation_config.eos_token_id == eos
    weights = AutoModelForCausalLM.from_pretrained(base).state_dict()
    assert all(torch.equal(v, weights[k] + 1) for k, v in exported.state_dict().items())
