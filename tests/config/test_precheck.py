"""The precheck of a multirun, in-process: every job of a basic sweep (the cartesian product
Hydra would launch) is composed and validated before any starts; a search sweeper's space
(Optuna's intervals) is checked at its bounds, and its objective must be able to exist."""

from __future__ import annotations

import pytest

from skyrl.config import precheck, register_configs
from skyrl.config.cli_errors import is_bad_input
from skyrl.config.precheck import command_line_problem, precheck_command_line

OPTUNA = ["-m", "hydra/sweeper=skyrl_optuna", "experiment=smoke"]


@pytest.fixture(autouse=True)
def _schemas():
    register_configs()


def test_a_bad_combination_names_its_job_and_overrides():
    # jobs: 0 (8,4)  1 (8,8)  2 (12,4)  3 (12,8); 12 % 8 != 0, so only job 3 is refused
    argv = ["-m", "trainer.train_batch_size=8,12", "trainer.policy_mini_batch_size=4,8"]
    assert precheck_command_line(argv) == (
        "error: trainer.policy_mini_batch_size: train_batch_size (12) must be divisible by "
        "policy_mini_batch_size (8); in sweep job 3 of 4: trainer.train_batch_size=12 "
        "trainer.policy_mini_batch_size=8"
    )
    assert is_bad_input(command_line_problem(argv))


def test_jobs_are_numbered_as_hydra_launches_them():
    # the last sweep varies fastest: (4,8) (4,12) (8,8) (8,12); only (8,12) fails
    argv = ["-m", "trainer.policy_mini_batch_size=4,8", "trainer.train_batch_size=8,12"]
    assert precheck_command_line(argv).endswith(
        "; in sweep job 3 of 4: trainer.policy_mini_batch_size=8 trainer.train_batch_size=12"
    )


def test_a_bad_value_alone_keeps_its_plain_message():
    argv = ["-m", "trainer.train_batch_size=16,abc", "trainer.seed=1,2"]
    assert precheck_command_line(argv) == (
        "error: trainer.train_batch_size: Value 'abc' of type 'str' could not be converted "
        "to Integer"
    )


def test_a_sweep_of_good_combinations_passes():
    assert command_line_problem(["-m", "trainer.seed=1,2", "algorithm=grpo,rloo"]) is None


def test_over_the_cap_each_value_is_checked_alone_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(precheck, "MAX_SWEEP_JOBS_CHECKED", 3)
    argv = ["-m", "trainer.train_batch_size=8,12", "trainer.policy_mini_batch_size=4,8"]
    assert command_line_problem(argv) is None  # each value alone is fine
    assert capsys.readouterr().err.splitlines() == [
        "warning: the sweep has 4 jobs, more than the 3 the precheck composes one by one: "
        "each swept value was checked alone, not every combination"
    ]


def test_a_bad_value_alone_is_still_found_over_the_cap(monkeypatch):
    monkeypatch.setattr(precheck, "MAX_SWEEP_JOBS_CHECKED", 1)
    argv = ["-m", "trainer.train_batch_size=8,-4", "trainer.seed=1,2"]
    assert precheck_command_line(argv) == "error: trainer.train_batch_size: must be >= 1, got -4"


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.policy_optimizer.lr=tag(log,interval(1e-5,1e-3))"],
        ["trainer.seed=1,2", "algorithm.eps_clip_high=interval(0.1,0.3)"],
        ["trainer.seed=range(1,4)"],
        [],  # the preset's own search space (hydra.sweeper.params)
    ],
)
def test_an_optuna_search_space_passes(overrides):
    assert command_line_problem([*OPTUNA, *overrides]) is None


def test_an_interval_is_checked_at_its_bounds():
    argv = [*OPTUNA, "trainer.policy_optimizer.lr=interval(-1e-3,1e-3)"]
    assert precheck_command_line(argv) == (
        "error: trainer.policy_optimizer.lr: must be > 0, got -0.001"
    )


def test_the_presets_search_space_is_checked_against_the_fixed_overrides():
    # skyrl_optuna searches algorithm.eps_clip_high over interval(0.2, 0.4); with this
    # train batch, no trial could run, whatever it samples
    argv = [*OPTUNA, "trainer.policy_mini_batch_size=3"]
    assert precheck_command_line(argv).startswith(
        "error: trainer.policy_mini_batch_size: train_batch_size (2) must be divisible by "
        "policy_mini_batch_size (3)"
    )


def test_a_bad_search_space_point_names_its_values():
    # each value is fine alone (smoke: batch 2, mini-batch 1); batch 3 with mini-batch 2 is
    # not. The preset's intervals (lr, eps_clip_high) are checked at their bounds, first.
    argv = [*OPTUNA, "trainer.train_batch_size=3,4", "trainer.policy_mini_batch_size=1,2"]
    assert precheck_command_line(argv) == (
        "error: trainer.policy_mini_batch_size: train_batch_size (3) must be divisible by "
        "policy_mini_batch_size (2); in search-space point trainer.policy_optimizer.lr=1e-06 "
        "algorithm.eps_clip_high=0.2 trainer.train_batch_size=3 trainer.policy_mini_batch_size=2"
    )


def test_an_interval_needs_a_search_sweeper():
    line = precheck_command_line(["-m", "trainer.policy_optimizer.lr=interval(1e-5,1e-3)"])
    assert line == (
        "error: trainer.policy_optimizer.lr: interval(1e-5,1e-3) is a search space; the "
        "basic sweeper only enumerates choice and range sweeps (use a search sweeper: "
        "hydra/sweeper=skyrl_optuna)"
    )


def test_sweeping_hydras_own_config_is_one_line():
    line = precheck_command_line([*OPTUNA, "hydra.sweeper.params.trainer.seed=1,2"])
    assert line == (
        "error: hydra.sweeper.params.trainer.seed: Hydra's own config cannot be swept "
        "(got '1,2'); put a search space on the key itself, e.g. trainer.seed=1,2"
    )


def test_fixed_hydra_overrides_are_not_composed_into_the_jobs():
    argv = [*OPTUNA, "hydra.sweeper.n_trials=2", "hydra.sweep.dir=x", "trainer.seed=1,2"]
    assert command_line_problem(argv) is None


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.num_eval_prompts=0"], "data.num_eval_prompts"),
        (["data.num_eval_prompts=0,4"], "data.num_eval_prompts"),
        (["data.source=fake"], "data.source"),
    ],
)
def test_an_optuna_sweep_without_an_objective_is_refused(overrides, key):
    line = precheck_command_line([*OPTUNA, *overrides])
    assert line is not None and line.startswith(f"error: {key}: "), line
    assert "eval/pass@1" in line


def test_a_basic_sweep_needs_no_objective():
    assert command_line_problem(["-m", "experiment=smoke", "data.num_eval_prompts=0"]) is None


def test_a_single_run_is_checked_as_before():
    assert precheck_command_line(["trainer.train_batch_size=10"]).startswith(
        "error: trainer.policy_mini_batch_size: train_batch_size (10)"
    )
    assert command_line_problem(["hydra/sweeper=skyrl_optuna", "data.num_eval_prompts=0"]) is None


def test_an_optuna_dry_run_into_a_persistent_study_is_refused():
    argv = [*OPTUNA, "trainer.dry_run=true", "hydra.sweeper.storage=sqlite:///study.db"]
    assert precheck_command_line(argv).startswith("error: hydra.sweeper.storage: a dry run ")
    assert command_line_problem([*OPTUNA, "trainer.dry_run=true"]) is None


def test_a_hydra_run_dir_under_a_file_is_one_line(tmp_path):
    # Hydra makes the run dir before the job starts; under a file that was a traceback
    (tmp_path / "afile").write_text("x")
    bad = tmp_path / "afile" / "run"
    assert precheck_command_line([f"hydra.run.dir={bad}"]) == (
        f"error: hydra.run.dir: {tmp_path / 'afile'} is a file, not a directory"
    )
    # the static part of an interpolated dir is checked: outputs_${now:...} lives in tmp_path
    assert precheck_command_line([f"hydra.run.dir={tmp_path}/afile/${{now:%H}}"]) is not None
    assert precheck_command_line([f"hydra.run.dir={tmp_path}/run_${{now:%H}}"]) is None
    assert precheck_command_line([f"hydra.run.dir={tmp_path}/fresh/run"]) is None


def test_a_hydra_sweep_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    argv = ["-m", f"hydra.sweep.dir={tmp_path}/afile/sweep", "trainer.seed=1,2"]
    assert precheck_command_line(argv) == (
        f"error: hydra.sweep.dir: {tmp_path / 'afile'} is a file, not a directory"
    )
