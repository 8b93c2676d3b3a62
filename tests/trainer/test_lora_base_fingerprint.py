"""A LoRA checkpoint holds only the adapters: its trainer state records a content fingerprint of
the base model (``base_fingerprint``), and a resume onto another base of the same shapes (another
fine-tune) is refused, naming ``model.path`` and the checkpoint; the same weights in another
folder resume. The trainer is built with ``__new__`` and fake workers (no Ray)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from skyrl.algorithms.kl_controllers import FixedKLController
from skyrl.config import ConfigError
from skyrl.models.fingerprint import BASE_FINGERPRINT, base_fingerprint
from skyrl.models.tiny import build_tiny_model
from skyrl.trainer.checkpoint import (
    CheckpointManager,
    check_base_model,
    read_trainer_state,
)
from skyrl.trainer.trainer import RLTrainer


class FakeWorkers:
    def __init__(self):
        self.calls: list[str] = []

    def run(self, method: str, *args) -> list:
        self.calls.append(method)
        return [None]


def _trainer(tmp_path, model_path: str, lora: bool = True) -> RLTrainer:
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(
        trainer=SimpleNamespace(resume="auto", zero_stage=0, precision="fp32"),
        model=SimpleNamespace(path=model_path, lora=SimpleNamespace(enabled=lora)),
        algorithm=SimpleNamespace(uses_reference=False),
    )
    tr.checkpoints = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    tr.policy, tr.critic = FakeWorkers(), None
    tr.rollouts = SimpleNamespace(state_dict=lambda: {}, load_state_dict=lambda state: None)
    tr.kl_ctrl = FixedKLController(0.1)
    tr.policy_version, tr.consecutive_nonfinite = 0, 0
    return tr


def test_a_copy_of_the_base_in_another_folder_resumes(tmp_path):
    base = build_tiny_model(tmp_path / "base")
    saved = _trainer(tmp_path, base).save_checkpoint(2)
    assert read_trainer_state(saved)[BASE_FINGERPRINT] == base_fingerprint(base)
    moved = shutil.copytree(base, tmp_path / "elsewhere" / "base")  # a moved cache, another node
    resumed = _trainer(tmp_path, str(moved))
    assert resumed.resume() == saved
    assert resumed.policy.calls == ["load_checkpoint"]


def test_a_base_of_the_same_shapes_with_other_weights_is_refused(tmp_path):
    # seed=1: the same architecture and shapes, other weights: before, the adapters were loaded
    # onto it without a word and training went on on the wrong base
    saved = _trainer(tmp_path, build_tiny_model(tmp_path / "base")).save_checkpoint(2)
    other = build_tiny_model(tmp_path / "other", seed=1)
    resumed = _trainer(tmp_path, other)
    with pytest.raises(ConfigError) as err:
        resumed.resume()
    assert str(err.value) == (
        f"model.path: {other} is not the base model the LoRA adapters of {saved} were trained "
        "on: it has the same tensor names and shapes but other weights (another fine-tune); "
        "resume with the model.path it was saved with"
    )
    assert resumed.policy.calls == []  # refused before the workers load the adapters


def test_a_base_of_other_shapes_says_so(tmp_path):
    base = build_tiny_model(tmp_path / "base")
    state = {BASE_FINGERPRINT: base_fingerprint(base)}
    deeper = build_tiny_model(tmp_path / "deeper", num_hidden_layers=3)
    with pytest.raises(ConfigError, match="other tensor names, dtypes or shapes") as err:
        check_base_model(tmp_path / "global_step_2", state, deeper)
    assert err.value.key == "model.path" and "\n" not in str(err.value)


def test_a_checkpoint_without_the_record_resumes_as_before(tmp_path):
    other = build_tiny_model(tmp_path / "other", seed=1)
    check_base_model(tmp_path / "global_step_2", {"step": 2}, other)  # saved before the record


def test_a_full_weights_run_records_nothing(tmp_path):
    saved = _trainer(tmp_path, build_tiny_model(tmp_path / "base"), lora=False).save_checkpoint(1)
    assert BASE_FINGERPRINT not in read_trainer_state(saved)


def test_a_base_without_safetensors_records_and_compares_nothing(tmp_path):
    bin_only = tmp_path / "bin_only"
    bin_only.mkdir()
    (bin_only / "pytorch_model.bin").write_bytes(b"\0" * 8)
    assert base_fingerprint(str(bin_only)) is None
    saved = _trainer(tmp_path, str(bin_only)).save_checkpoint(1)
    assert BASE_FINGERPRINT not in read_trainer_state(saved)
    state = {BASE_FINGERPRINT: base_fingerprint(build_tiny_model(tmp_path / "base"))}
    check_base_model(saved, state, str(bin_only))  # nothing to compare with


def test_a_base_overwritten_in_place_is_fingerprinted_again(tmp_path):
    # Cached by path alone, a notebook that replaced the base's files at the same path (another
    # fine-tune of the same shapes) kept the old fingerprint, and a resume onto it passed.
    base = Path(build_tiny_model(tmp_path / "base"))
    other = Path(build_tiny_model(tmp_path / "other", seed=1))
    before = base_fingerprint(str(base))
    shutil.copyfile(other / "model.safetensors", base / "model.safetensors")
    assert base_fingerprint(str(base)) == base_fingerprint(str(other)) != before
