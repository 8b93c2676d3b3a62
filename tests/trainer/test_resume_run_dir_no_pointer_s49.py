"""``trainer.resume=<run dir>`` (or its checkpoints dir) whose ``latest`` pointer is gone (a run
killed after its first save but before it published it, a pointer deleted by hand) resumes
from the newest complete checkpoint, as ``trainer.resume=auto`` does there; it was refused
with "no trainer_state.json and no 'latest' pointer"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skyrl.trainer.checkpoint import CheckpointManager, find_checkpoint, resolve_resume


def _checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    ckpt = run / "checkpoints" / f"global_step_{step}"
    (ckpt / "policy").mkdir(parents=True)
    if complete:
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
    return ckpt


@pytest.mark.parametrize("named", ["run", "run/checkpoints"])
def test_a_dir_without_a_pointer_resumes_its_newest_complete_checkpoint(tmp_path, named):
    run = tmp_path / "run"
    _checkpoint(run, 1)
    newest = _checkpoint(run, 3)
    _checkpoint(run, 4, complete=False)  # a save that did not finish
    manager = CheckpointManager(tmp_path / "elsewhere" / "checkpoints", 0)
    assert resolve_resume(str(tmp_path / named), manager) == newest.absolute()
    # what auto gives in that run dir
    assert CheckpointManager(run / "checkpoints", 0).resumable() == newest


def test_a_pointer_still_decides(tmp_path):
    run = tmp_path / "run"
    older = _checkpoint(run, 1)
    _checkpoint(run, 3)  # a rewound run's abandoned step
    (run / "checkpoints" / "latest").write_text("global_step_1\n")
    assert find_checkpoint(run) == older


def test_a_dir_without_any_complete_checkpoint_is_still_refused(tmp_path):
    run = tmp_path / "run"
    _checkpoint(run, 2, complete=False)
    manager = CheckpointManager(tmp_path / "elsewhere" / "checkpoints", 0)
    with pytest.raises(ValueError, match="no trainer_state.json and no 'latest' pointer"):
        resolve_resume(str(run), manager)
