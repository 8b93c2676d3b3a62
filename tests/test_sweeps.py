"""Sweeps: the summary writer on fake job directories (fast), and through the real CLI on the
tiny model (slow): a 2-job multirun with the summary callback, and a 2-trial Optuna search."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from skyrl.sweeps import SweepSummary, collect_jobs, write_job_return, write_summary

SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")
TINY_JOB = [
    "experiment=smoke", "trainer.total_steps=1", "trainer.export_hf=false",
    "data.num_eval_prompts=2", "generator.max_generate_length=8",
]  # fmt: skip


def make_job(sweep_dir: Path, num: int, overrides: list[str], rewards: list[float],
             pass_at_1: float | None, output_dir: str | None = None) -> Path:  # fmt: skip
    """A job directory as Hydra and the trainer leave it: .hydra/*.yaml and metrics.jsonl.
    With ``output_dir`` (saved unresolved, as Hydra saves it) the trainer wrote there instead;
    metrics.jsonl then goes to ``output_dir`` resolved for this job's ``hydra:job.num``."""
    job_dir = sweep_dir / str(num)
    (job_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")
    OmegaConf.save(
        OmegaConf.create({"hydra": {"job": {"num": num}}}), job_dir / ".hydra" / "hydra.yaml"
    )
    OmegaConf.save(
        OmegaConf.create({"trainer": {"output_dir": output_dir}}),
        job_dir / ".hydra" / "config.yaml",
    )
    records = [{"step": i + 1, "generate/reward_mean": r} for i, r in enumerate(rewards)]
    if pass_at_1 is not None and records:
        records[-1]["eval/pass@1"] = pass_at_1
    out = Path(output_dir.replace("${hydra:job.num}", str(num))) if output_dir else job_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return job_dir


def job_return(status: JobStatus, value) -> JobReturn:
    """A Hydra ``JobReturn`` as ``run_job`` hands it to ``on_job_end``."""
    ret = JobReturn()
    ret.status = status
    ret._return_value = value
    return ret


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_summary_rows_metrics_and_statuses(tmp_path):
    rewards = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    ok = make_job(tmp_path, 0, ["algorithm=grpo", "trainer.policy_optimizer.lr=1e-4"], rewards, 0.5)
    failed = make_job(
        tmp_path, 1, ["algorithm=rloo", "trainer.policy_optimizer.lr=1e-4"], [0.2], None
    )
    make_job(tmp_path, 2, ["algorithm=rloo", "+extra.key=3"], [], None)  # died: no job_return.json
    write_job_return(ok, job_return(JobStatus.COMPLETED, 0.5))
    write_job_return(failed, job_return(JobStatus.FAILED, RuntimeError("rank 1 died")))

    csv_path, png_path = write_summary(tmp_path, finished=True)

    rows = read_csv(csv_path)
    assert list(rows[0])[:4] == ["job", "algorithm", "trainer.policy_optimizer.lr", "extra.key"]
    assert [r["job"] for r in rows] == ["0", "1", "2"]
    assert [r["status"] for r in rows] == ["ok", "failed", "failed"]
    assert rows[1]["error"] == "RuntimeError: rank 1 died"
    assert "without recording a result" in rows[2]["error"]
    # 7 rewards: windows of 7 // 2 = 3 steps, so they share none (5 each shared .2, .3, .4):
    # first (0+.1+.2)/3 = 0.1; last (.4+.5+.6)/3 = 0.5
    assert float(rows[0]["reward_first5_mean"]) == pytest.approx(0.1, abs=1e-9)
    assert float(rows[0]["reward_last5_mean"]) == pytest.approx(0.5, abs=1e-9)
    assert rows[0]["eval/pass@1"] == "0.5" and rows[0]["steps"] == "7"
    assert rows[1]["eval/pass@1"] == "" and rows[1]["steps"] == "1"
    assert rows[2]["extra.key"] == "3" and rows[0]["extra.key"] == ""
    assert rows[0]["output_dir"] == str(ok)
    assert png_path.read_bytes()[:4] == b"\x89PNG"


def test_a_damaged_metrics_file_empties_its_jobs_metrics_not_the_summary(tmp_path):
    # before: read_history's error ended write_summary, so no job had a row
    make_job(tmp_path, 0, ["algorithm=grpo"], [0.25], 0.75)
    bad = make_job(tmp_path, 1, ["algorithm=rloo"], [0.5, 0.5], None)
    path = bad / "metrics.jsonl"
    path.write_text(path.read_text().replace("\n", "\ngarbage\n", 1))  # line 2 of 3
    for job in (tmp_path / "0", bad):
        write_job_return(job, job_return(JobStatus.COMPLETED, 0.5))

    rows = read_csv(write_summary(tmp_path, finished=True)[0])

    assert [(r["status"], r["steps"]) for r in rows] == [("ok", "1"), ("ok", "0")]
    assert rows[0]["error"] == ""
    assert rows[1]["error"] == (
        f"{path}:2 is not a metrics record: 'garbage'; fix or delete that line, then run "
        "again (the file was left as it was)"
    )


def test_a_job_without_its_end_recorded_is_running_until_the_sweep_ends(tmp_path):
    make_job(tmp_path, 0, ["algorithm=grpo"], [0.1], 0.0)
    assert [r["status"] for r in collect_jobs(tmp_path, finished=False)] == ["running"]
    assert [r["status"] for r in collect_jobs(tmp_path, finished=True)] == ["failed"]


def test_callback_records_each_job_and_rewrites_the_summary(tmp_path):
    from hydra.types import RunMode

    job_dir = make_job(tmp_path, 0, ["algorithm=grpo"], [0.25], 0.75)
    config = OmegaConf.create(
        {"hydra": {"mode": RunMode.MULTIRUN, "runtime": {"output_dir": str(job_dir)},
                   "sweep": {"dir": str(tmp_path)}}}
    )  # fmt: skip
    SweepSummary().on_job_end(config, job_return(JobStatus.COMPLETED, 0.75))

    assert json.loads((job_dir / "job_return.json").read_text())["objective"] == 0.75
    (row,) = read_csv(tmp_path / "summary.csv")
    assert row["status"] == "ok" and row["reward_last5_mean"] == "0.25"
    SweepSummary().on_multirun_end(config)
    assert (tmp_path / "summary.png").stat().st_size > 0


def test_interpolated_output_dirs_give_each_job_its_own_metrics(tmp_path):
    """``trainer.output_dir=.../outs/${hydra:job.num}``: Hydra saves it unresolved, and
    re-resolving it later (under another job's HydraConfig, or none at the sweep's end) named
    the wrong job. The callback records each job's resolved dir while that job is current."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from hydra.types import RunMode

    setup_globals()  # registers the ``hydra:`` resolver, as Hydra's main does
    sweep_dir, outs = tmp_path / "multirun", tmp_path / "outs"
    output_dir = str(outs) + "/${hydra:job.num}"

    def assert_own_metrics(rows: list[dict[str, str]]) -> None:
        assert [r["reward_last5_mean"] for r in rows] == ["0.1", "0.9"]
        assert [r["output_dir"] for r in rows] == [str(outs / "0"), str(outs / "1")]

    callback = SweepSummary()
    try:
        for num, reward in ((0, 0.1), (1, 0.9)):
            job_dir = make_job(sweep_dir, num, [f"trainer.reward={reward}"], [reward], None,
                               output_dir=output_dir)  # fmt: skip
            config = OmegaConf.create({"hydra": HydraConf(), "trainer": {"output_dir": output_dir}})
            config.hydra.mode = RunMode.MULTIRUN
            config.hydra.job.num = num
            config.hydra.runtime.output_dir = str(job_dir)
            config.hydra.sweep.dir = str(sweep_dir)
            HydraConfig.instance().set_config(config)  # as Hydra's run_job does for each job
            callback.on_job_start(config=config, task_function=None)
            callback.on_job_end(config, job_return(JobStatus.COMPLETED, reward))
        assert_own_metrics(read_csv(sweep_dir / "summary.csv"))  # written after the last job
        HydraConfig.instance().cfg = None  # none at the end of the multirun
        callback.on_multirun_end(config)
    finally:
        HydraConfig.instance().cfg = None
    assert_own_metrics(read_csv(sweep_dir / "summary.csv"))


def test_an_output_dir_under_home_is_recorded_expanded(tmp_path, monkeypatch):
    """``trainer.output_dir='~/outs/0'``: the job's trainer writes under the home (as
    ``skyrl.train`` expands it), so its row reads the metrics there; before, the recorded dir
    was ``<cwd>/~/outs/0`` and the row had no metrics."""
    from skyrl.sweeps import write_job_output_dir

    home, job_dir = tmp_path / "home", tmp_path / "sweep" / "0"
    job_dir.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    path = write_job_output_dir(job_dir, OmegaConf.create({"trainer": {"output_dir": "~/outs/0"}}))
    assert path.read_text() == str(home / "outs" / "0")


def test_a_placeholder_objective_is_null_and_a_compact_error_is_its_line(tmp_path):
    """A dry-run trial tells Optuna -inf (no result); bad input in a job fails it with the
    single run's ``error:`` line, recorded as it is."""
    from hydra.errors import CompactHydraException

    dry = make_job(tmp_path, 0, ["trainer.dry_run=true"], [], None)
    bad = make_job(tmp_path, 1, ["model.path=/x"], [], None)
    write_job_return(dry, job_return(JobStatus.COMPLETED, -math.inf))
    line = "error: model.path: '/x': no such directory"
    write_job_return(bad, job_return(JobStatus.FAILED, CompactHydraException(line)))
    assert json.loads((dry / "job_return.json").read_text())["objective"] is None
    assert [r["error"] for r in collect_jobs(tmp_path)] == ["", line]


def test_no_metrics_gives_nan_not_an_error(tmp_path):
    job_dir = make_job(tmp_path, 0, ["algorithm=grpo"], [], None)
    (job_dir / "metrics.jsonl").unlink()
    (row,) = collect_jobs(tmp_path)
    assert row["steps"] == 0 and math.isnan(row["eval/pass@1"])
    write_summary(tmp_path)


@pytest.mark.parametrize(
    ("overrides", "key", "expected"),
    [
        (["hydra/callbacks=sweep_summary"], "callbacks.sweep_summary._target_",
         "skyrl.sweeps.SweepSummary"),
        (["hydra/sweeper=skyrl_optuna"], "sweeper.direction", "maximize"),
        (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], "launcher.n_jobs", 2),
    ],
)  # fmt: skip
def test_sweep_presets_compose(overrides, key, expected):
    """The presets the README documents compose with the smoke experiment."""
    from hydra import compose, initialize_config_dir

    from skyrl.api import CONF_DIR
    from skyrl.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", ["experiment=smoke", *overrides], return_hydra_config=True)
    assert OmegaConf.select(cfg.hydra, key) == expected


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SKYRL_TRAIN, "-m", "hydra.sweep.dir=sweep", *args],
        cwd=cwd, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_optuna_dry_run_plans_each_trial_and_ends_cleanly(tmp_path):
    """A dry run has no objective: each trial is checked and planned, the sweeper is told the
    worst value, and the sweep ends without an error (the search space from the command line
    is sampled, not enumerated)."""
    result = run_cli(
        tmp_path, "hydra/sweeper=skyrl_optuna", "hydra.sweeper.n_trials=2", "experiment=smoke",
        "trainer.policy_optimizer.lr=tag(log,interval(1e-5,1e-3))", "trainer.dry_run=true",
        "hydra/callbacks=sweep_summary",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout.count("dry run: no objective") == 2
    lrs = [
        OmegaConf.load(tmp_path / "sweep" / str(n) / "resolved_config.yaml").trainer.policy_optimizer.lr
        for n in (0, 1)
    ]  # fmt: skip
    assert all(1e-5 <= lr <= 1e-3 for lr in lrs), lrs
    assert [r["status"] for r in read_csv(tmp_path / "sweep" / "summary.csv")] == ["ok", "ok"]
    record = json.loads((tmp_path / "sweep" / "0" / "job_return.json").read_text())
    assert record["objective"] is None  # the placeholder is not a result


def test_optuna_sweep_without_eval_prompts_is_refused_before_any_trial(tmp_path):
    result = run_cli(
        tmp_path, "hydra/sweeper=skyrl_optuna", "experiment=smoke", "data.num_eval_prompts=0",
        "trainer.dry_run=true",
    )  # fmt: skip
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: data.num_eval_prompts: "), line
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_multirun_writes_one_dir_per_job_and_the_summary(tmp_path):
    result = run_cli(tmp_path, "hydra/callbacks=sweep_summary", "algorithm=grpo,rloo", *TINY_JOB)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "sweep"
    assert all((sweep / str(n) / "metrics.jsonl").exists() for n in (0, 1))
    rows = read_csv(sweep / "summary.csv")
    assert [(r["job"], r["algorithm"], r["status"], r["steps"]) for r in rows] == [
        ("0", "grpo", "ok", "1"),
        ("1", "rloo", "ok", "1"),
    ]
    assert all(r["eval/pass@1"] != "" for r in rows)  # each job evaluated at its last step
    assert (sweep / "summary.png").stat().st_size > 0
    assert "sweep summary:" in result.stdout


@pytest.mark.slow
def test_optuna_preset_runs_two_trials(tmp_path):
    result = run_cli(
        tmp_path, "hydra/sweeper=skyrl_optuna", "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=1", "hydra/callbacks=sweep_summary", *TINY_JOB,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    best = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert set(best.best_params) == {"trainer.policy_optimizer.lr", "algorithm.eps_clip_high"}
    assert 0.0 <= best.best_value <= 1.0
    rows = read_csv(tmp_path / "sweep" / "summary.csv")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all(1e-6 <= float(r["trainer.policy_optimizer.lr"]) <= 1e-3 for r in rows)


def test_an_eval_sweep_lists_its_failed_jobs(tmp_path):
    """``skyrl-eval -m``: a job that fails as a single eval would (exit 2, its one line) is
    recorded like a ``skyrl-train`` job's. Before: the job called ``sys.exit(2)``, which ended
    the sweep with no ``job_return.json`` and no row; job 1 never ran, and with job 0 failing
    there was no summary at all."""
    (tmp_path / "file").write_text("")
    result = subprocess.run(
        [str(Path(SKYRL_TRAIN).with_name("skyrl-eval")), "-m", "hydra.sweep.dir=sweep",
         "model.path=skyrl-tiny", "generator=hf",
         "eval.output_file=file/a.json,file/b.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    line = "error: eval.output_file: file/{}.json: file is a file, not a directory"
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == line.format("a")
    assert "Traceback" not in result.stderr + result.stdout
    rows = read_csv(tmp_path / "sweep" / "summary.csv")
    assert [(r["job"], r["status"], r["error"]) for r in rows] == [
        ("0", "failed", line.format("a")),
        ("1", "failed", line.format("b")),
    ]


def test_an_eval_sweeps_job_reports_the_pass_at_1_of_its_results_file(tmp_path):
    # skyrl-eval -m writes eval_results.json in each job's dir and no metrics.jsonl: the
    # summary's eval/pass@1 column was empty for every job, which the docs read as "never
    # evaluated". The eval's pass@1 (0.625) is now the job's, at 0 training steps.
    job_dir = make_job(tmp_path, 0, ["generator.eval_sampling.temperature=0.5"], [], None)
    (job_dir / "metrics.jsonl").unlink()
    results = {"metrics": {"eval/pass@1": 0.625, "eval/reward_mean": 0.7}, "num_prompts": {}}
    (job_dir / "eval_results.json").write_text(json.dumps(results))
    (row,) = collect_jobs(tmp_path)
    assert row["steps"] == 0 and row["eval/pass@1"] == 0.625
    # a results file that is not JSON leaves the column empty and says why
    (job_dir / "eval_results.json").write_text("{cut")
    (row,) = collect_jobs(tmp_path)
    assert math.isnan(row["eval/pass@1"])
    assert f"{job_dir / 'eval_results.json'} is not an eval results file (Expecting" in row["error"]
