"""Checkpoint directories: atomic commit, ``latest`` pointer, pruning, resume resolution."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skyrl.trainer.checkpoint import (
    FILE_SIZES,
    CheckpointManager,
    check_file_sizes,
    read_trainer_state,
    resolve_resume,
)


def _save(manager: CheckpointManager, step: int) -> None:
    tmp = manager.temp_dir(step)
    (tmp / "policy").mkdir()
    (tmp / "policy" / "weights.bin").write_bytes(b"w" * step)
    manager.commit(tmp, step, {"step": step})


def test_commit_renames_points_latest_and_prunes(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=2)
    for step in (1, 2, 3):
        _save(manager, step)
    assert manager.steps() == [2, 3]  # step 1 pruned: keep 2
    assert manager.latest() == tmp_path / "checkpoints" / "global_step_3"
    assert read_trainer_state(manager.latest()) == {"step": 3}
    assert not list((tmp_path / "checkpoints").glob(".tmp_*"))


def test_a_save_killed_midway_leaves_the_previous_checkpoint_usable(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 1)
    tmp = manager.temp_dir(2)  # the process dies here: workers wrote part of step 2
    (tmp / "policy").mkdir()
    assert manager.latest() == tmp_path / "checkpoints" / "global_step_1"
    assert manager.steps() == [1]  # the temp dir is not a checkpoint
    assert resolve_resume("auto", manager) == manager.latest()
    _save(manager, 2)  # the next save of step 2 replaces the stale temp dir
    assert manager.steps() == [1, 2] and manager.latest().name == "global_step_2"


def _killed_save(root: Path, step: int) -> Path:
    """The temp dir a save of ``step`` killed midway leaves (a worker's part written)."""
    tmp = root / f".tmp_global_step_{step}"
    (tmp / "policy").mkdir(parents=True)
    (tmp / "policy" / "part.bin").write_bytes(b"p")
    return tmp


def test_a_resume_removes_every_stale_temp_dir(tmp_path):
    # A run killed while saving step 2 left .tmp_global_step_2; resumed with another
    # ckpt_interval it never saved step 2 again, and the temp dir stayed for good.
    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, max_to_keep=0)
    _save(manager, 1)
    stale = [_killed_save(root, 2), _killed_save(root, 7)]
    resumed = CheckpointManager(root, max_to_keep=0)
    resumed.resume_from(resumed.latest())  # latest names global_step_1 already
    assert not any(tmp.exists() for tmp in stale)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "latest"]


def test_the_first_save_of_a_run_removes_every_stale_temp_dir(tmp_path):
    # a fresh run into a dir whose earlier run was killed mid-save (the run dir check allows
    # it when nothing was committed), or a resumed run that saves before any resume_from
    root = tmp_path / "checkpoints"
    stale = [_killed_save(root, 3), _killed_save(root, 5)]
    manager = CheckpointManager(root, max_to_keep=0)
    _save(manager, 1)  # step 1: neither stale step saved again
    assert not any(tmp.exists() for tmp in stale)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "latest"]


def test_resume_resolution(tmp_path):
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", max_to_keep=0)
    assert resolve_resume("auto", manager) is None  # nothing saved yet: fresh start
    assert resolve_resume("none", manager) is None
    _save(manager, 4)
    ckpt = tmp_path / "run" / "checkpoints" / "global_step_4"
    assert resolve_resume("auto", manager) == ckpt
    assert resolve_resume("none", manager) is None
    assert resolve_resume(str(ckpt), manager) == ckpt  # a checkpoint dir
    assert resolve_resume(str(tmp_path / "run"), manager) == ckpt  # a run dir: its latest
    with pytest.raises(ValueError, match=r"trainer.resume=.*nowhere.*not a checkpoint"):
        resolve_resume(str(tmp_path / "nowhere"), manager)


def test_a_resume_path_that_is_missing_or_a_file_says_so(tmp_path, monkeypatch):
    """A mistyped path, ``latest`` (the pointer's name, not a value ``trainer.resume`` takes) and
    a file in a checkpoint all read "not a checkpoint (no trainer_state.json) and no 'latest'
    pointer": for ``.../trainer_state.json`` itself too, and never that the path is not there.
    An empty ``trainer.resume=`` resumed the working dir's run, if it was one."""
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", max_to_keep=0)
    _save(manager, 4)
    ckpt = manager.root / "global_step_4"
    monkeypatch.chdir(tmp_path)
    for resume, path in (
        (str(tmp_path / "run" / "checkpoints" / "global_step_5"), ckpt.with_name("global_step_5")),
        ("latest", Path("latest")),  # relative: the working dir's, where there is none
    ):
        with pytest.raises(ValueError) as err:
            resolve_resume(resume, manager)
        assert str(err.value) == (
            f"trainer.resume={resume}: not a checkpoint: {path} does not exist (trainer.resume "
            "takes auto, none, or the path of a checkpoint global_step_N or of a run dir)"
        )
    for file in (ckpt / "trainer_state.json", manager.root / "latest"):
        with pytest.raises(ValueError) as err:
            resolve_resume(str(file), manager)
        assert str(err.value) == (
            f"trainer.resume={file}: not a checkpoint: {file} is a file (name the checkpoint "
            "global_step_N or the run dir)"
        )
    monkeypatch.chdir(tmp_path / "run")
    with pytest.raises(ValueError) as err:  # `trainer.resume=`: was the working dir, this run
        resolve_resume("", manager)
    assert str(err.value) == (
        "trainer.resume=: not a checkpoint: empty (trainer.resume takes auto, none, or the path "
        "of a checkpoint global_step_N or of a run dir)"
    )
    half = ckpt.with_name("global_step_6")  # copied without its trainer state
    (half / "policy").mkdir(parents=True)
    with pytest.raises(ValueError) as err:
        resolve_resume(str(half), manager)
    assert str(err.value) == (
        f"trainer.resume={half}: not a checkpoint: {half} has no trainer_state.json (a save or a "
        "copy that did not finish)"
    )
    with pytest.raises(ValueError) as err:  # a dir, but no run's
        resolve_resume(str(tmp_path), manager)
    assert str(err.value) == (
        f"trainer.resume={tmp_path}: not a checkpoint: no trainer_state.json and no 'latest' "
        f"pointer in {tmp_path} or {tmp_path / 'checkpoints'}"
    )
    assert resolve_resume(str(ckpt), manager) == ckpt  # the dir itself still resumes


def test_a_latest_pointer_that_is_not_text_is_named(tmp_path):
    """Was a ``UnicodeDecodeError`` traceback from ``read_text``, naming no file."""
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 2)
    (manager.root / "latest").write_bytes(b"\xff\xfeglobal_step_2")
    for call in (manager.latest, lambda: resolve_resume("auto", manager)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == (
            f"{manager.root / 'latest'} is not a 'latest' pointer (not UTF-8 text): delete it "
            "and resume from a checkpoint by its path (trainer.resume=<global_step_N>)"
        )


def test_the_temp_dir_of_a_killed_save_is_refused_as_a_resume_target(tmp_path):
    # A run killed between writing step 2's trainer state and renaming its temp dir leaves a
    # .tmp_global_step_2 that looks complete. Resumed from it, the run loaded it, then removed
    # every stale temp dir (this one too) and pointed `latest` at the removed dir: the
    # checkpoint was gone and a kill before the next save resumed from nothing.
    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, max_to_keep=0)
    _save(manager, 1)
    tmp = _killed_save(root, 2)
    (tmp / "trainer_state.json").write_text('{"step": 2}')
    with pytest.raises(ValueError) as err:
        resolve_resume(str(tmp), manager)
    assert str(err.value) == (
        f"trainer.resume={tmp}: the temp dir of a save that did not finish (the run was killed "
        "while saving), which a resumed run removes: resume from a global_step_N beside it (or, "
        "if it holds trainer_state.json, rename it to global_step_N first)"
    )
    assert (tmp / "trainer_state.json").is_file()  # nothing removed
    assert manager.latest() == root / "global_step_1"


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_file_cut_short_or_missing_since_the_save_is_named(tmp_path, damage):
    # Before, a truncated model states file reached the user as the workers' torch.load
    # traceback, a removed one as a bare "AssertionError" from DeepSpeed's loader.
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 3)  # policy/weights.bin: 3 bytes
    ckpt = manager.root / "global_step_3"
    check_file_sizes(ckpt)  # as saved: passes
    weights = ckpt / "policy" / "weights.bin"
    if damage == "truncated":
        weights.write_bytes(b"w")
        expected = f"{weights} has 1 bytes, but was saved with 3: {ckpt} is damaged"
    else:
        weights.unlink()
        expected = f"{weights} is missing: {ckpt} is not a complete checkpoint"
    with pytest.raises(ValueError) as err:
        check_file_sizes(ckpt)
    assert str(err.value) == expected


def test_a_checkpoint_saved_before_the_file_sizes_record_still_resumes(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 1)
    (manager.root / "global_step_1" / FILE_SIZES).unlink()
    check_file_sizes(manager.root / "global_step_1")  # nothing to compare: passes


def test_latest_naming_an_incomplete_dir_is_an_error(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "latest").write_text("global_step_9\n")
    with pytest.raises(ValueError, match="global_step_9, which is not a complete checkpoint"):
        CheckpointManager(root, 0).latest()


def test_an_unpublished_commit_moves_neither_latest_nor_pruning(tmp_path):
    """The trainer commits a step's checkpoint, logs the step, then publishes: a kill between
    the two resumes from the step before (whose metrics line exists), even at max_to_keep=1."""
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=1)
    _save(manager, 1)
    tmp = manager.temp_dir(2)
    final = manager.commit(tmp, 2, {"step": 2}, publish=False)
    assert final == tmp_path / "checkpoints" / "global_step_2"
    assert manager.steps() == [1, 2]  # step 1 not pruned yet: latest still names it
    assert manager.latest() == tmp_path / "checkpoints" / "global_step_1"
    manager.publish(final)
    assert manager.latest() == final
    assert manager.steps() == [2]


def test_a_rewound_run_never_prunes_the_checkpoint_it_just_published(tmp_path):
    # Steps 8 and 16 on disk (keep 2); the run resumed from step 2 saves step 4. Pruning by
    # step kept the two highest (8, 16) and deleted step 4 right after `latest` named it.
    # Checkpoints past the one published belong to the abandoned timeline: left alone (a
    # re-run of their step replaces them); pruning counts only those up to the published one.
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=2)
    for step in (2, 8, 16):
        _save(manager, step)
    assert manager.steps() == [8, 16]
    _save(manager, 4)
    assert manager.latest() == tmp_path / "checkpoints" / "global_step_4"
    assert manager.steps() == [4, 8, 16]
    _save(manager, 6)  # keep 2 among those up to 6: 4 and 6
    assert manager.steps() == [4, 6, 8, 16]
    _save(manager, 8)  # the re-run of step 8 replaces the old one: 6 and 8 kept
    assert manager.steps() == [6, 8, 16] and read_trainer_state(manager.latest()) == {"step": 8}


def test_a_rewound_run_keeps_latest_on_its_resume_checkpoint_at_every_kill_point(
    tmp_path, monkeypatch
):
    # Run A published steps 2 and 4; run B resumes from step 2 (its tracker drops the records
    # of steps 3 and 4), then re-saves step 4, unpublished until logged. Before, `latest` kept
    # naming step 4 throughout: B killed during step 4's eval resumed from B's step 4 with no
    # metrics record, and killed between removing A's step 4 and renaming B's, from nothing.
    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, max_to_keep=0)
    for step in (2, 4):
        _save(manager, step)
    manager.resume_from(root / "global_step_2")
    assert manager.latest() == root / "global_step_2"
    # killed between the rmtree of A's step 4 and the rename of B's into place
    real_replace = os.replace

    def killed(src, dst):
        if Path(dst).name == "global_step_4":
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        manager.commit(manager.temp_dir(4), 4, {"step": 4}, publish=False)
    assert manager.steps() == [2] and resolve_resume("auto", manager) == root / "global_step_2"
    monkeypatch.setattr(os, "replace", real_replace)
    # killed after the commit, during the step's eval or logging
    manager.commit(manager.temp_dir(4), 4, {"step": 4, "run": "B"}, publish=False)
    assert resolve_resume("auto", manager) == root / "global_step_2"
    manager.publish(root / "global_step_4")  # after the record of step 4
    assert read_trainer_state(manager.latest()) == {"step": 4, "run": "B"}


def test_resuming_from_another_runs_checkpoint_points_latest_at_it(tmp_path):
    # this run dir's own step 4 loses its records once the run resumes from the other run's
    # step 2: `latest` names the other checkpoint (by its full path) until this run publishes
    other = CheckpointManager(tmp_path / "other" / "checkpoints", max_to_keep=0)
    _save(other, 2)
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", max_to_keep=0)
    _save(manager, 4)
    manager.resume_from(other.root / "global_step_2")
    assert manager.latest() == other.root / "global_step_2"
    assert resolve_resume("auto", manager) == other.root / "global_step_2"
    _save(manager, 3)
    assert manager.latest() == manager.root / "global_step_3"


def test_resuming_from_latest_itself_leaves_the_pointer_alone(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    _save(manager, 2)
    pointer = manager.root / "latest"
    before = pointer.stat().st_mtime_ns
    manager.resume_from(manager.root / "global_step_2")
    assert pointer.read_text() == "global_step_2\n" and pointer.stat().st_mtime_ns == before


def test_export_of_a_model_with_its_own_code(tiny_model_path, tmp_path):
    """model.trust_remote_code: the export builds the model's own class from its config."""
    import torch
    from custom_code_model import custom_code_model  # tests/ is on sys.path
    from transformers import AutoModelForCausalLM

    from skyrl.trainer.checkpoint import export_checkpoint_hf

    torch.set_num_threads(1)
    base = custom_code_model(tiny_model_path, tmp_path / "custom_model")
    model = AutoModelForCausalLM.from_pretrained(base, trust_remote_code=True)
    weights = {k: v + 1 for k, v in model.state_dict().items()}  # "trained": every weight + 1
    state = tmp_path / "ckpt" / "policy" / "state"
    state.mkdir(parents=True)
    torch.save({"module": weights}, state / "mp_rank_00_model_states.pt")  # ZeRO <= 2 layout

    out = export_checkpoint_hf(
        tmp_path / "ckpt", base, base, tmp_path / "exported", trust_remote_code=True
    )
    exported = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert type(exported).__name__ == "CustomForCausalLM"
    for name, tensor in exported.state_dict().items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0)
