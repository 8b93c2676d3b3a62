"""A run rewound to an earlier checkpoint with another ``trainer.ckpt_interval`` passes steps
of the abandoned branch without saving them, so no re-run replaces their checkpoints.
``max_ckpts_to_keep=2``, interval 3 up to step 9 (6 and 9 kept), then
``trainer.resume=<run>/checkpoints/global_step_6 trainer.ckpt_interval=2
trainer.total_steps=10``: the dir held the abandoned branch's step 9 and this run's step 10,
and this run's step 8 was pruned in its place. The checkpoints are driven as the trainer
drives them (``resume_from``, then ``commit`` and ``publish`` per saved step)."""

from __future__ import annotations

from pathlib import Path

from skyrl.trainer.checkpoint import CheckpointManager, resolve_resume


def save(manager: CheckpointManager, step: int, branch: str, publish: bool = True) -> None:
    tmp = manager.temp_dir(step)
    (tmp / "weights").write_text(f"{branch}{step}")
    manager.commit(tmp, step, {"step": step}, publish=publish)


def branches(root: Path) -> dict[int, str]:
    manager = CheckpointManager(root, 0)
    return {s: (root / f"global_step_{s}" / "weights").read_text() for s in manager.steps()}


def rewound(root: Path, keep: int, to_step: int) -> CheckpointManager:
    manager = CheckpointManager(root, keep)  # a new run (process)
    manager.resume_from(resolve_resume(str(root / f"global_step_{to_step}"), manager))
    return manager


def test_a_rewind_with_another_interval_keeps_its_own_checkpoints(tmp_path):
    root = tmp_path / "checkpoints"
    first = CheckpointManager(root, 2)
    for step in (3, 6, 9):
        save(first, step, "a")
    assert branches(root) == {6: "a6", 9: "a9"}
    second = rewound(root, 2, to_step=6)
    save(second, 8, "b")
    assert branches(root) == {6: "a6", 8: "b8", 9: "a9"}  # a9: ahead of latest, not counted
    save(second, 10, "b")
    assert branches(root) == {8: "b8", 10: "b10"}  # was {9: "a9", 10: "b10"}


def test_an_abandoned_checkpoint_after_a_kill_and_resume_from_latest_goes_too(tmp_path):
    # interval 3 up to 12; rewound to 6 with interval 4: step 10 saved, 12 still ahead; killed
    # in step 11, resumed from latest (10); step 12 is re-saved, 9 was passed at step 10
    root = tmp_path / "checkpoints"
    first = CheckpointManager(root, 3)
    for step in (3, 6, 9, 12):
        save(first, step, "a")
    second = rewound(root, 3, to_step=6)
    save(second, 10, "b")
    assert branches(root) == {6: "a6", 10: "b10", 12: "a12"}  # 12: replaced when re-run
    third = CheckpointManager(root, 3)
    third.resume_from(resolve_resume("auto", third))  # latest: global_step_10
    save(third, 14, "b")
    assert branches(root) == {6: "a6", 10: "b10", 14: "b14"}  # a12 passed, never re-run


def test_keeping_every_checkpoint_still_drops_the_abandoned_ones_passed(tmp_path):
    root = tmp_path / "checkpoints"
    first = CheckpointManager(root, 0)
    for step in (3, 6, 9):
        save(first, step, "a")
    second = rewound(root, 0, to_step=6)
    save(second, 8, "b")
    save(second, 10, "b")
    assert branches(root) == {3: "a3", 6: "a6", 8: "b8", 10: "b10"}


def test_a_resume_with_the_same_interval_keeps_the_usual_rotation(tmp_path):
    root = tmp_path / "checkpoints"
    first = CheckpointManager(root, 2)
    for step in (2, 4):
        save(first, step, "a")
    second = rewound(root, 2, to_step=4)
    for step in (6, 8):
        save(second, step, "b")
    assert branches(root) == {6: "b6", 8: "b8"}


def test_an_unpublished_checkpoint_ahead_of_latest_is_replaced_not_passed(tmp_path):
    # killed in step 4's eval (saved, unpublished); resumed from latest (2): step 4 re-saved
    root = tmp_path / "checkpoints"
    first = CheckpointManager(root, 2)
    save(first, 2, "a")
    save(first, 4, "a", publish=False)
    second = CheckpointManager(root, 2)
    second.resume_from(resolve_resume("auto", second))
    assert (root / "latest").read_text() == "global_step_2\n"
    save(second, 4, "b")
    assert branches(root) == {2: "a2", 4: "b4"}
