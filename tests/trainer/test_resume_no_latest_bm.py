"""``trainer.resume=auto`` in a checkpoints dir without a ``latest`` pointer (a run killed
after its first save but before it logged that step, or the pointer deleted): it resumes
from the newest complete checkpoint, which it points ``latest`` at, instead of starting
fresh and replacing the saved ones as it reaches their steps."""

from __future__ import annotations

from skyrl.trainer.checkpoint import CheckpointManager, resolve_resume


def _save(manager: CheckpointManager, step: int, publish: bool = True) -> None:
    tmp = manager.temp_dir(step)
    (tmp / "policy").mkdir()
    (tmp / "policy" / "weights.bin").write_bytes(b"w" * step)
    manager.commit(tmp, step, {"step": step}, publish=publish)


def test_auto_without_latest_resumes_from_the_newest_complete_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    for step in (2, 4):
        _save(manager, step)
    (manager.root / "latest").unlink()  # deleted by hand
    ckpt = resolve_resume("auto", manager)
    assert ckpt == manager.root / "global_step_4"  # not None: a fresh run replaced 2 and 4
    manager.resume_from(ckpt)  # what the trainer does next: the pointer is back
    assert (manager.root / "latest").read_text() == "global_step_4\n"


def test_a_first_checkpoint_killed_before_it_was_published_is_resumed(tmp_path):
    # the trainer saves with publish=False and publishes once the step's record is logged:
    # a kill in between (the step's eval, say) leaves global_step_3 and no pointer
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=2)
    _save(manager, 3, publish=False)
    assert not (manager.root / "latest").exists()
    assert resolve_resume("auto", manager) == manager.root / "global_step_3"


def test_auto_without_latest_skips_a_damaged_newest_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    for step in (2, 4, 6):
        _save(manager, step)
    (manager.root / "latest").unlink()
    # step 6: a weights file cut short (6 bytes saved, 1 now); step 4: no trainer state
    (manager.root / "global_step_6" / "policy" / "weights.bin").write_bytes(b"w")
    (manager.root / "global_step_4" / "trainer_state.json").unlink()
    assert resolve_resume("auto", manager) == manager.root / "global_step_2"


def test_auto_without_any_checkpoint_still_starts_fresh(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    assert resolve_resume("auto", manager) is None
    (manager.root / "global_step_5").mkdir(parents=True)  # no trainer state: not complete
    assert resolve_resume("auto", manager) is None


def test_a_stopped_run_names_the_unpublished_checkpoint_auto_resumes_from(tmp_path):
    # Ctrl-C during the eval of the first checkpointed step: the line said "no checkpoint was
    # saved" although trainer.resume=auto continues from global_step_3
    import signal

    from skyrl.cli import interrupted_line

    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=2)
    _save(manager, 3, publish=False)
    assert interrupted_line(tmp_path, signal.SIGINT) == (
        f"interrupted; last checkpoint: {manager.root / 'global_step_3'} "
        "(trainer.resume=auto continues from it)"
    )
