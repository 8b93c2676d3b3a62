"""Rerunning a ``skyrl-eval`` sweep into a dir holding an earlier sweep's jobs is refused
saying what an eval would do there: its rows would join the summary and the jobs would write
over the earlier results. It said this sweep's jobs "would resume the checkpoints in theirs",
which an eval never does (that is ``skyrl-train``'s harm)."""

from __future__ import annotations

from skyrl.config import register_configs
from skyrl.config.cli_errors import one_line_error
from skyrl.config.precheck import command_line_problem


def test_an_eval_sweep_rerun_names_the_evals_own_harm(tmp_path):
    for n in (0, 1):
        (tmp_path / str(n) / ".hydra").mkdir(parents=True)
        (tmp_path / str(n) / ".hydra" / "overrides.yaml").write_text("- trainer.seed=1\n")
    argv = ["-m", "experiment=smoke", "trainer.seed=1,2", f"hydra.sweep.dir={tmp_path}"]
    register_configs()
    problem = command_line_problem(argv, preflight_jobs=False)  # skyrl-eval's precheck
    assert one_line_error(problem) == (
        f"error: hydra.sweep.dir: {tmp_path} already holds the job dirs of an earlier sweep "
        "(0, 1): their rows would join this sweep's summary.csv and this sweep's jobs would "
        "write over the results in theirs; choose a new hydra.sweep.dir or remove them"
    )
