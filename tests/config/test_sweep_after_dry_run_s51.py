"""A sweep dry-run first (``-m ... trainer.dry_run=true``) and then run in the same
``hydra.sweep.dir``: the dry run's job dirs hold no checkpoints and the real jobs take them
over, so the precheck lets the sweep start. It refused it, saying the jobs "would resume the
checkpoints in theirs"."""

from __future__ import annotations

from cli_runs import run

from skyrl.config import register_configs
from skyrl.config.precheck import command_line_problem, precheck_command_line

SWEEP = ["-m", "experiment=smoke", "algorithm=grpo,rloo"]


def test_a_sweep_runs_where_its_dry_run_ran_and_a_longer_dry_run_is_refused(tmp_path):
    sweep_dir = tmp_path / "sweep"
    dry = run(
        tmp_path, "skyrl-train", *SWEEP, "trainer.dry_run=true", f"hydra.sweep.dir={sweep_dir}"
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert (sweep_dir / "1" / ".hydra" / "overrides.yaml").exists()  # Hydra's job dirs 0 and 1

    register_configs()
    assert command_line_problem([*SWEEP, f"hydra.sweep.dir={sweep_dir}"]) is None
    # a sweep of one job leaves the dry run's job 1 over: its row would join the summary
    assert precheck_command_line(
        ["-m", "experiment=smoke", "algorithm=grpo", f"hydra.sweep.dir={sweep_dir}"]
    ) == (
        f"error: hydra.sweep.dir: {sweep_dir} already holds the job dirs of an earlier dry-run "
        "sweep (1): their rows would join this sweep's summary.csv (no job of this sweep "
        "takes them over); choose a new hydra.sweep.dir or remove them"
    )
    # a dry run's dir a job trained in since (it saved checkpoints) is an earlier job again
    (sweep_dir / "0" / "checkpoints").mkdir()
    assert precheck_command_line([*SWEEP, f"hydra.sweep.dir={sweep_dir}"]) == (
        f"error: hydra.sweep.dir: {sweep_dir} already holds the job dirs of an earlier sweep "
        "(0): their rows would join this sweep's summary.csv and this sweep's jobs would "
        "resume the checkpoints in theirs; choose a new hydra.sweep.dir or remove them"
    )
