"""``trainer.resume`` naming a folder inside a checkpoint (``.../global_step_4/policy``, where
DeepSpeed keeps its own ``latest`` file naming ``state``) read "policy/latest names
policy/state, which is not a complete checkpoint": it blamed DeepSpeed's file as a broken
pointer of ours and never named the checkpoint to resume from."""

from __future__ import annotations

import pytest

from skyrl.trainer.checkpoint import CheckpointManager, resolve_resume


def _deepspeed_like_checkpoint(manager: CheckpointManager, step: int):
    tmp = manager.temp_dir(step)
    (tmp / "policy" / "state").mkdir(parents=True)
    (tmp / "policy" / "latest").write_text("state")  # what engine.save_checkpoint writes
    (tmp / "policy" / "rng_rank0.pt").write_bytes(b"rng")
    return manager.commit(tmp, step, {"step": step, "kl_coef": 0.0})


@pytest.mark.parametrize("inside", ["policy", "policy/state"])
def test_a_folder_inside_a_checkpoint_names_the_checkpoint(tmp_path, inside):
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", max_to_keep=0)
    ckpt = _deepspeed_like_checkpoint(manager, 4)
    path = ckpt / inside
    with pytest.raises(ValueError) as err:
        resolve_resume(str(path), manager)
    assert str(err.value) == (
        f"trainer.resume={path}: not a checkpoint: {path} is a folder inside the checkpoint "
        f"{ckpt} (name the checkpoint itself: trainer.resume={ckpt})"
    )
    assert resolve_resume(str(ckpt), manager) == ckpt  # the checkpoint itself resumes
    assert resolve_resume(str(tmp_path / "run"), manager) == ckpt  # and its run dir
