"""``skyrl.train`` in a run dir whose checkpoints have no ``latest`` pointer: it says, in one
line, that it resumes from the newest complete one (a fresh run replaced them all)."""

from __future__ import annotations

import json
from pathlib import Path

import skyrl
from skyrl.config.preflight import check_run_dir
from skyrl.config.validate import validate


def _checkpoint(run: Path, step: int, dp_size: int = 2) -> Path:
    """A complete checkpoint of ``run`` at ``step`` as the trainer leaves it, without the
    ``latest`` pointer; saved by ``dp_size`` ranks (the smoke experiment's)."""
    ckpt = run / "checkpoints" / f"global_step_{step}"
    (ckpt / "policy").mkdir(parents=True)
    for rank in range(dp_size):
        (ckpt / "policy" / f"rng_rank{rank}.pt").write_bytes(b"")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "kl_coef": 0.0}))
    return ckpt


def _cfg(*overrides: str):
    return validate(skyrl.compose(["experiment=smoke", "trainer.dry_run=true", *overrides]))


def test_auto_without_latest_resumes_from_the_newest_and_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    _checkpoint(run, 4)
    newest = _checkpoint(run, 8)
    assert check_run_dir(_cfg(), run) == newest
    assert capsys.readouterr().err == (
        f"warning: trainer.resume=auto: {run / 'checkpoints'} holds global_step_4, "
        "global_step_8 but no 'latest' pointer (a run stopped before it published them, or "
        f"the pointer was removed): resuming from the newest complete one, {newest} (to start "
        "fresh instead, use another trainer.output_dir)\n"
    )


def test_auto_without_latest_and_no_complete_checkpoint_starts_fresh(tmp_path, capsys):
    run = tmp_path / "run"
    (_checkpoint(run, 4) / "trainer_state.json").unlink()  # a copy that did not finish
    assert check_run_dir(_cfg(), run) is None
    assert capsys.readouterr().err == (
        f"warning: trainer.resume=auto: {run / 'checkpoints'} holds global_step_4 but no "
        "'latest' pointer (a run stopped before it published them, or the pointer was "
        "removed): none is complete (no trainer_state.json, or files cut short): this run "
        "starts fresh and replaces them\n"
    )


def test_a_resume_by_path_or_with_latest_prints_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    ckpt = _checkpoint(run, 4)
    assert check_run_dir(_cfg(f"trainer.resume={ckpt}"), run) == ckpt.absolute()
    (run / "checkpoints" / "latest").write_text("global_step_4\n")
    assert check_run_dir(_cfg(), run) == ckpt
    assert capsys.readouterr().err == ""
