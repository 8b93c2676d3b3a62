"""A ``skyrl-eval`` sweep whose config fixes ``trainer.output_dir`` (an experiment's run dir,
or the training command line reused with ``eval.checkpoint`` added) was refused before its
first job: "jobs 0 and 1 of 2 both write there (job 1 would resume job 0's checkpoints)",
a training sweep's rule. skyrl-eval writes nothing there (each job writes in its own Hydra
job dir), so only a job dir shared by two jobs is refused."""

from __future__ import annotations

import sys

import pytest

from skyrl import eval_cli


def check(monkeypatch, *argv: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["skyrl-eval", *argv])
    eval_cli._check_command_line()  # exits 2 on a problem


def test_jobs_sharing_trainer_output_dir_are_not_refused(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    check(
        monkeypatch, "-m", "experiment=smoke", f"hydra.sweep.dir={tmp_path}/sweep",
        f"trainer.output_dir={run}", f"eval.checkpoint={run}", "data.num_eval_prompts=1,2",
    )  # fmt: skip
    assert capsys.readouterr().err == ""


def test_jobs_sharing_one_job_dir_are_still_refused(monkeypatch, capsys, tmp_path):
    """Each would write its eval_results.json over the last one's."""
    with pytest.raises(SystemExit) as exc:
        check(
            monkeypatch, "-m", "experiment=smoke", f"hydra.sweep.dir={tmp_path}/sweep",
            f"trainer.output_dir={tmp_path}/run", "hydra.sweep.subdir=same",
            "data.num_eval_prompts=1,2",
        )  # fmt: skip
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: hydra.sweep.subdir: {tmp_path}/sweep/same: jobs 0 and 1 of 2 both write there"
    ), err
