"""The printed plan says where the run starts: fresh, or the checkpoint it resumes (a dry run
into an earlier run's dir said nothing of it, so a user could not tell it would continue
from step 4 rather than start over)."""

from __future__ import annotations

from test_run_dir import checkpoint, dry_run  # tests/config: the dry-run and checkpoint helpers


def _start_row(out: str) -> str:
    [row] = [line for line in out.splitlines() if line.strip().startswith("start ")]
    return " ".join(row.split())


def test_a_fresh_run_says_it_starts_fresh(tmp_path, capsys):
    dry_run(tmp_path / "run")
    assert _start_row(capsys.readouterr().out) == "start fresh"


def test_a_resumed_run_names_its_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    checkpoint(run, 4)
    checkpoint(run, 8)
    dry_run(run)  # trainer.resume=auto: the newest, `latest` names global_step_8
    ckpt = run / "checkpoints" / "global_step_8"
    assert _start_row(capsys.readouterr().out) == f"start resumes {ckpt} (saved after step 8)"
    dry_run(run, f"trainer.resume={run / 'checkpoints' / 'global_step_4'}")
    ckpt = run / "checkpoints" / "global_step_4"
    assert _start_row(capsys.readouterr().out) == f"start resumes {ckpt} (saved after step 4)"
