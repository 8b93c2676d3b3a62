"""A full-weights run with a reference model (a KL term) resumed onto another ``model.path``.

The checkpoint holds the policy's weights, so any model of the same shapes loaded it; but the
reference workers load ``model.path`` at every start. ``trainer.resume`` with another
fine-tune of the same shapes there went on with the KL term against another model than the
steps before the resume, without a word. The trainer state now records the reference's
fingerprint (``REFERENCE_FINGERPRINT``) and such a resume is refused before the workers load
anything. The trainer is built with ``__new__`` and fake workers (no Ray).
"""

from __future__ import annotations

import shutil

import pytest
from test_lora_base_fingerprint import _trainer as lora_trainer  # tests/trainer, the test's dir

from skyrl.config import ConfigError
from skyrl.models.fingerprint import BASE_FINGERPRINT, base_fingerprint
from skyrl.models.tiny import build_tiny_model
from skyrl.trainer.checkpoint import REFERENCE_FINGERPRINT, read_trainer_state
from skyrl.trainer.trainer import RLTrainer


def _trainer(tmp_path, model_path: str, uses_reference: bool = True) -> RLTrainer:
    """The LoRA test's stand-in trainer (fake workers), training the full weights."""
    tr = lora_trainer(tmp_path, model_path, lora=False)
    tr.cfg.algorithm.uses_reference = uses_reference
    return tr


def test_a_resume_onto_another_reference_of_the_same_shapes_is_refused(tmp_path):
    base = build_tiny_model(tmp_path / "base")
    saved = _trainer(tmp_path, base).save_checkpoint(2)
    state = read_trainer_state(saved)
    assert state[REFERENCE_FINGERPRINT] == base_fingerprint(base)
    assert BASE_FINGERPRINT not in state  # the LoRA record: export and eval compare that one
    other = build_tiny_model(tmp_path / "other", seed=1)  # same architecture, other weights
    resumed = _trainer(tmp_path, other)
    with pytest.raises(ConfigError) as err:
        resumed.resume()
    assert err.value.key == "model.path"
    assert str(err.value) == (
        f"model.path: {other} is not the model {saved} was trained from: it has the same tensor "
        "names and shapes but other weights (another fine-tune), and the reference workers "
        "load model.path (the KL term would compare against another model than before the "
        "resume); resume with the model.path it was saved with"
    )
    assert resumed.policy.calls == []  # refused before the workers load anything
    moved = shutil.copytree(
        base, tmp_path / "elsewhere" / "base"
    )  # the same weights: a moved cache
    copy = _trainer(tmp_path, str(moved))
    assert copy.resume() == saved and copy.policy.calls == ["load_checkpoint"]


def test_a_resume_without_a_reference_may_take_another_model_path(tmp_path):
    # KL turned off: nothing loads model.path's weights beyond the architecture, which the
    # checkpoint's weights replace
    saved = _trainer(tmp_path, build_tiny_model(tmp_path / "base")).save_checkpoint(2)
    other = build_tiny_model(tmp_path / "other", seed=1)
    resumed = _trainer(tmp_path, other, uses_reference=False)
    assert resumed.resume() == saved


def test_a_run_without_a_reference_records_nothing(tmp_path):
    tr = _trainer(tmp_path, build_tiny_model(tmp_path / "base"), uses_reference=False)
    assert REFERENCE_FINGERPRINT not in read_trainer_state(tr.save_checkpoint(1))
