"""Resuming: a damaged checkpoint offers the last complete one before it, and a fixed KL
coefficient is the config's, not the one the checkpoint saved. The trainer is built with
``__new__`` and fake workers (no Ray)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from skyrl.algorithms.kl_controllers import AdaptiveKLController, FixedKLController
from skyrl.config import ConfigError
from skyrl.trainer.checkpoint import CheckpointManager, check_resumable, read_trainer_state
from skyrl.trainer.trainer import RLTrainer


def _save(manager: CheckpointManager, step: int, kl_coef: float = 0.1) -> None:
    tmp = manager.temp_dir(step)
    (tmp / "policy").mkdir()
    (tmp / "policy" / "rng_rank0.pt").write_bytes(b"12345678")  # 8 bytes
    manager.commit(tmp, step, {"step": step, "kl_coef": kl_coef, "zero_stage": 0})


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_checkpoint_offers_the_last_complete_one_before_it(tmp_path, damage):
    # Before, the line named the damaged file only: the user had to find out which of the
    # other global_step_N was whole (step 3 here is damaged too, step 1 is whole).
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    for step in (1, 3, 5):
        _save(manager, step)
    root = manager.root
    (root / "global_step_3" / "policy" / "rng_rank0.pt").unlink()
    ckpt = root / "global_step_5"
    rng = ckpt / "policy" / "rng_rank0.pt"
    if damage == "truncated":
        rng.write_bytes(b"1234")  # 4 of its 8 bytes
        problem = f"{rng} has 4 bytes, but was saved with 8: {ckpt} is damaged"
    else:
        rng.unlink()
        problem = f"{rng} is missing: {ckpt} is not a complete checkpoint"
    with pytest.raises(ConfigError) as err:
        check_resumable(ckpt, read_trainer_state(ckpt), zero_stage=0)
    assert err.value.key == "trainer.resume"
    assert err.value.message == (
        f"{problem}; the last complete checkpoint before it is {root / 'global_step_1'}"
    )


def test_a_damaged_first_checkpoint_offers_nothing(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 2)
    _save(manager, 4)  # later: not a way back
    ckpt = manager.root / "global_step_2"
    (ckpt / "policy" / "rng_rank0.pt").unlink()
    with pytest.raises(ConfigError) as err:
        check_resumable(ckpt, read_trainer_state(ckpt), zero_stage=0)
    assert err.value.message == (
        f"{ckpt / 'policy' / 'rng_rank0.pt'} is missing: {ckpt} is not a complete checkpoint"
    )


def test_latest_naming_a_removed_checkpoint_offers_the_last_complete_one(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 2)
    _save(manager, 4)
    root = manager.root
    (root / "global_step_4" / "trainer_state.json").unlink()  # a copy that stopped midway
    with pytest.raises(ValueError) as err:
        manager.latest()
    assert str(err.value) == (
        f"{root / 'latest'} names {root / 'global_step_4'}, which is not a complete checkpoint; "
        f"the last complete checkpoint before it is {root / 'global_step_2'}"
    )


class FakeWorkers:
    def run(self, method: str, *args) -> list:
        return [None]


def _resumed(tmp_path, kl_ctrl, saved_kl_coef: float) -> RLTrainer:
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 2, kl_coef=saved_kl_coef)
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(trainer=SimpleNamespace(resume="auto", zero_stage=0))
    tr.checkpoints, tr.policy, tr.critic = manager, FakeWorkers(), None
    tr.rollouts = SimpleNamespace(load_state_dict=lambda state: None)
    tr.kl_ctrl = kl_ctrl
    assert tr.resume() == manager.root / "global_step_2"
    return tr


def test_a_fixed_kl_coefficient_changed_for_the_resume_is_the_configs(tmp_path, capsys):
    # Saved at algorithm.init_kl_coef=0.05, resumed with 0.2 under kl_ctrl=fixed ("a constant
    # coefficient"): before, the run trained on at the saved 0.05, and said nothing.
    tr = _resumed(tmp_path, FixedKLController(0.2), saved_kl_coef=0.05)
    assert tr.kl_ctrl.value == 0.2
    assert capsys.readouterr().out == (
        "resumed with the config's algorithm.init_kl_coef over the saved KL coefficient: "
        "0.05 -> 0.2\n"
    )


def test_an_unchanged_fixed_kl_coefficient_resumes_silently(tmp_path, capsys):
    tr = _resumed(tmp_path, FixedKLController(0.05), saved_kl_coef=0.05)
    assert tr.kl_ctrl.value == 0.05
    assert capsys.readouterr().out == ""


def test_the_adaptive_kl_coefficient_is_the_saved_one(tmp_path):
    # the controller's state: 0.05 x 0.92 x 0.92 after two steps far below the target
    tr = _resumed(tmp_path, AdaptiveKLController(0.05, 0.1, 10), saved_kl_coef=0.04232)
    assert tr.kl_ctrl.value == 0.04232


@pytest.mark.parametrize("pointer", [b"\xff\xfe global_step_4\n", b"\x00\x00\x00\x00"])
def test_a_resume_by_path_replaces_a_latest_pointer_that_names_nothing(tmp_path, pointer):
    # `latest` not UTF-8 (or the NULs of a file zeroed by a crash): trainer.resume=auto is
    # refused with "resume from a checkpoint by its path"; doing so passed the pre-flight
    # check, then ended the run in a traceback once the workers had loaded the checkpoint.
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 2)
    (manager.root / "latest").write_bytes(pointer)
    manager.resume_from(manager.root / "global_step_2")
    assert (manager.root / "latest").read_text() == "global_step_2\n"
    assert manager.latest() == manager.root / "global_step_2"
