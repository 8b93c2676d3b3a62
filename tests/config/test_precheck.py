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


@pytest.mark.parametrize(
    ("override", "line"),
    [
        # Optuna's own refusals came after the sweep started: "No trials are completed yet",
        # "Please set either 'minimize' or 'maximize'", as tracebacks
        ("hydra.sweeper.n_trials=0", "error: hydra.sweeper.n_trials: must be >= 1, got 0"),
        (
            "hydra.sweeper.direction=maximise",
            "error: hydra.sweeper.direction: must be minimize or maximize (the final "
            "eval/pass@1: maximize), got 'maximise'",
        ),
    ],
)
def test_optuna_settings_optuna_refuses_are_one_line(override, line):
    assert precheck_command_line([*OPTUNA, override]) == line


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


def test_a_sweep_whose_jobs_are_each_valid_passes():
    # smoke: batch 2, mini-batch 1. Alone, mini-batch 4 or 8 fails against batch 2, but every
    # job pairs it with batch 8 or 16: 8 % 4 = 8 % 8 = 16 % 4 = 16 % 8 = 0 (and 16 training
    # prompts: smoke's 8 would be too few for batch 16, which each job's pre-flight checks)
    argv = [
        "-m", "experiment=smoke", "trainer.train_batch_size=8,16",
        "trainer.policy_mini_batch_size=4,8", "data.num_train_prompts=16",
    ]  # fmt: skip
    assert command_line_problem(argv) is None


def test_a_value_failing_alone_but_valid_in_a_job_names_the_first_failing_job():
    # jobs: 0 (8,4) 1 (8,8) 2 (6,4) 3 (6,8); mini-batch 4 fails alone (smoke batch 2) but
    # job 0 takes it; 6 % 4 = 2, so job 2 is the first that fails
    argv = [
        "-m", "experiment=smoke", "trainer.train_batch_size=8,6",
        "trainer.policy_mini_batch_size=4,8",
    ]  # fmt: skip
    assert precheck_command_line(argv) == (
        "error: trainer.policy_mini_batch_size: train_batch_size (6) must be divisible by "
        "policy_mini_batch_size (4); in sweep job 2 of 4: trainer.train_batch_size=6 "
        "trainer.policy_mini_batch_size=4"
    )


def test_a_value_bad_in_every_job_with_another_message_names_its_job():
    # mini-batch 32 fails in every job (8 % 32, 16 % 32), but alone it names smoke's batch 2,
    # which no job has: the first failing job, 1 (8,32), is named instead
    argv = [
        "-m", "experiment=smoke", "trainer.train_batch_size=8,16",
        "trainer.policy_mini_batch_size=4,32",
    ]  # fmt: skip
    assert precheck_command_line(argv) == (
        "error: trainer.policy_mini_batch_size: train_batch_size (8) must be divisible by "
        "policy_mini_batch_size (32); in sweep job 1 of 4: trainer.train_batch_size=8 "
        "trainer.policy_mini_batch_size=32"
    )


def test_over_the_cap_a_value_failing_alone_is_tried_in_its_first_job(monkeypatch, capsys):
    monkeypatch.setattr(precheck, "MAX_SWEEP_JOBS_CHECKED", 3)
    # mini-batch 4 fails alone (smoke batch 2); its first job, 0 (8,4), takes it
    argv = [
        "-m", "experiment=smoke", "trainer.train_batch_size=8,16",
        "trainer.policy_mini_batch_size=4,8",
    ]  # fmt: skip
    assert command_line_problem(argv) is None
    assert "more than the 3 the precheck composes" in capsys.readouterr().err


def test_jobs_sharing_a_fixed_output_dir_are_refused(tmp_path):
    # job 1 would resume job 0's final checkpoint there and train 0 steps
    shared = tmp_path / "shared"
    argv = [
        "-m", "experiment=smoke", f"trainer.output_dir={shared}", "algorithm=grpo,rloo",
        f"hydra.sweep.dir={tmp_path}/sweep",
    ]  # fmt: skip
    assert precheck_command_line(argv) == (
        f"error: trainer.output_dir: {shared}: jobs 0 and 1 of 2 both write there (job 1 "
        "would resume job 0's checkpoints); leave trainer.output_dir unset so each job "
        "writes to its own sweep subdir, sweep it, or make it per job (e.g. "
        f"trainer.output_dir={shared}/${{hydra:job.num}})"
    )
    assert is_bad_input(command_line_problem(argv))


def test_a_relative_output_dir_is_per_job_when_jobs_run_in_their_own_dirs(tmp_path, monkeypatch):
    # hydra.job.chdir=true runs each job in <sweep dir>/<num>: trainer.output_dir=ckpt is
    # <sweep dir>/0/ckpt and <sweep dir>/1/ckpt, not one <cwd>/ckpt (it was refused)
    monkeypatch.chdir(tmp_path)
    argv = [
        "-m", "experiment=smoke", "hydra.job.chdir=true", "trainer.output_dir=ckpt",
        "trainer.seed=1,2", f"hydra.sweep.dir={tmp_path}/sweep",
    ]  # fmt: skip
    assert command_line_problem(argv) is None
    without_chdir = [line for line in argv if not line.startswith("hydra.job.chdir")]
    assert precheck_command_line(without_chdir).startswith(
        f"error: trainer.output_dir: {tmp_path / 'ckpt'}: jobs 0 and 1 of 2 both write there"
    )


def test_two_of_the_jobs_sharing_an_output_dir_are_refused(tmp_path):
    # the dir names the seed only: jobs 0 (seed 1, grpo) and 1 (seed 1, rloo) share it
    argv = [
        "-m", "experiment=smoke", f"trainer.output_dir={tmp_path}/${{trainer.seed}}",
        "trainer.seed=1,2", "algorithm=grpo,rloo", f"hydra.sweep.dir={tmp_path}/sweep",
    ]  # fmt: skip
    assert precheck_command_line(argv).startswith(
        f"error: trainer.output_dir: {tmp_path}/1: jobs 0 and 1 of 4 both write there"
    )


def test_a_fixed_sweep_subdir_is_refused(tmp_path):
    argv = ["-m", "trainer.seed=1,2", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=run"]
    assert precheck_command_line(argv).startswith(
        f"error: hydra.sweep.subdir: {tmp_path}/run: jobs 0 and 1 of 2 both write there"
    )


def test_optuna_trials_sharing_an_output_dir_are_refused(tmp_path):
    argv = [*OPTUNA, f"trainer.output_dir={tmp_path}/out", f"hydra.sweep.dir={tmp_path}/s"]
    assert precheck_command_line(argv).startswith(
        f"error: trainer.output_dir: {tmp_path}/out: trials 0 and 1 both write there"
    )
    one_trial = [*argv, "hydra.sweeper.n_trials=1"]
    assert command_line_problem(one_trial) is None


@pytest.mark.parametrize(
    "output_dir",
    [
        None,  # each job in its sweep subdir
        "{tmp}/out/${{hydra:job.num}}",
        "{tmp}/${{algorithm.advantage_estimator}}",  # grpo, rloo
    ],
)
def test_per_job_output_dirs_pass(tmp_path, output_dir):
    argv = ["-m", "experiment=smoke", "algorithm=grpo,rloo", f"hydra.sweep.dir={tmp_path}/s"]
    if output_dir is not None:
        argv.append("trainer.output_dir=" + output_dir.format(tmp=tmp_path))
    assert command_line_problem(argv) is None


def test_a_swept_output_dir_is_one_per_job_only_when_swept_alone(tmp_path):
    argv = ["-m", f"trainer.output_dir={tmp_path}/a,{tmp_path}/b", f"hydra.sweep.dir={tmp_path}/s"]
    assert command_line_problem(argv) is None
    # with the seed swept too: jobs 0 (a, 1) 1 (a, 2) 2 (b, 1) 3 (b, 2)
    assert precheck_command_line([*argv, "trainer.seed=1,2"]).startswith(
        f"error: trainer.output_dir: {tmp_path}/a: jobs 0 and 1 of 4 both write there"
    )


def test_a_single_run_may_name_hydras_job(tmp_path):
    # ${hydra:...} resolves in the job (Hydra's config is current there); the precheck too
    assert command_line_problem([f"trainer.output_dir={tmp_path}/${{hydra:job.name}}"]) is None


def test_a_sweep_dir_holding_an_earlier_sweeps_jobs_is_refused(tmp_path):
    # an earlier sweep's job 2 would join this sweep's summary.csv; its jobs 0 and 1 would
    # hand their checkpoints to this sweep's jobs 0 and 1 (trainer.resume=auto)
    for n in (0, 1, 2):
        (tmp_path / str(n) / ".hydra").mkdir(parents=True)
        (tmp_path / str(n) / ".hydra" / "overrides.yaml").write_text("- trainer.seed=1\n")
    argv = ["-m", "trainer.seed=1,2", f"hydra.sweep.dir={tmp_path}"]
    assert precheck_command_line(argv) == (
        f"error: hydra.sweep.dir: {tmp_path} already holds the job dirs of an earlier sweep "
        "(0, 1, 2): their rows would join this sweep's summary.csv and this sweep's jobs "
        "would resume the checkpoints in theirs; choose a new hydra.sweep.dir or remove them"
    )
    (tmp_path / "other").mkdir()  # anything else in the dir is no job
    fresh = tmp_path / "other"
    assert command_line_problem(["-m", "trainer.seed=1,2", f"hydra.sweep.dir={fresh}"]) is None
