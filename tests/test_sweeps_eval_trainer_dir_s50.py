"""A ``skyrl-eval`` sweep whose config sets ``trainer.output_dir`` to a training run's directory
(the training command line reused with ``eval.checkpoint`` added, or an experiment that fixes
the run dir): skyrl-eval writes its results in its Hydra job dir whatever that key says, but
the callback recorded the key as the job's output dir, and the summary row was the TRAINING
run's (its steps, its last eval/pass@1, its dir) instead of the eval's."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.types import RunMode
from omegaconf import OmegaConf

from skyrl import cli, eval_cli
from skyrl.sweeps import JOB_OUTPUT_DIR, SweepSummary, write_summary

SKYRL_EVAL = str(Path(sys.executable).parent / "skyrl-eval")


def training_run(run: Path) -> Path:
    """A run dir as skyrl-train leaves it: 2 steps, an eval of pass@1 0.25 after the last."""
    run.mkdir(parents=True)
    records = [
        {"step": 1, "generate/reward_mean": 0.5},
        {"step": 2, "generate/reward_mean": 0.5, "eval/pass@1": 0.25},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def rows(sweep: Path) -> list[dict[str, str]]:
    with open(sweep / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def job(sweep: Path, run: Path, task) -> Path:
    """Job 0 of ``sweep``, started by the callback as Hydra starts it, with ``task`` (the
    function ``@hydra.main`` wraps) and ``trainer.output_dir`` set to ``run``."""
    job_dir = sweep / "0"
    (job_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create([f"trainer.output_dir={run}"]),
                   job_dir / ".hydra" / "overrides.yaml")  # fmt: skip
    OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": 0}}}),
                   job_dir / ".hydra" / "hydra.yaml")  # fmt: skip
    hydra = {"mode": RunMode.MULTIRUN, "runtime": {"output_dir": str(job_dir)}}
    config = OmegaConf.create({"trainer": {"output_dir": str(run)}, "hydra": hydra})
    SweepSummary().on_job_start(config=config, task_function=task)
    return job_dir


def test_an_eval_jobs_row_is_its_eval_not_the_training_run_it_names(tmp_path):
    run = training_run(tmp_path / "run")
    sweep = tmp_path / "sweep"
    job_dir = job(sweep, run, eval_cli._hydra_main.__wrapped__)
    assert (job_dir / JOB_OUTPUT_DIR).read_text() == str(job_dir)
    # what skyrl-eval wrote: 3 of 4 samples passed
    (job_dir / "eval_results.json").write_text(json.dumps({"metrics": {"eval/pass@1": 0.75}}))
    (job_dir / "job_return.json").write_text(
        json.dumps({"status": "ok", "objective": 0.75, "error": ""})
    )
    write_summary(sweep)
    assert [(r["steps"], r["eval/pass@1"], r["output_dir"]) for r in rows(sweep)] == [
        ("0", "0.75", str(job_dir))
    ]


def test_a_training_jobs_row_still_reads_its_trainer_output_dir(tmp_path):
    run = training_run(tmp_path / "run")
    sweep = tmp_path / "sweep"
    job_dir = job(sweep, run, cli._hydra_main.__wrapped__)
    assert (job_dir / JOB_OUTPUT_DIR).read_text() == str(run)
    write_summary(sweep, finished=False)
    assert [(r["steps"], r["eval/pass@1"], r["output_dir"]) for r in rows(sweep)] == [
        ("2", "0.25", str(run))
    ]


@pytest.mark.slow
def test_skyrl_eval_sweep_over_a_training_run_dir(tmp_path):
    """The real command: a training sweep's command line (``trainer.output_dir`` per job)
    reused for two greedy eval jobs; each row holds the pass@1 of its own results file."""
    runs = [training_run(tmp_path / "runs" / str(num)) for num in (0, 1)]
    sweep = tmp_path / "sweep"
    argv = [
        SKYRL_EVAL, "-m", "experiment=smoke", f"hydra.sweep.dir={sweep}",
        f"trainer.output_dir={tmp_path}/runs/${{hydra:job.num}}", "data.num_eval_prompts=1,2",
        "generator.eval_n_samples_per_prompt=1", "generator.eval_sampling.temperature=0",
    ]  # fmt: skip
    result = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    got = [(r["job"], r["steps"], r["eval/pass@1"], r["output_dir"]) for r in rows(sweep)]
    expected = []
    for num in (0, 1):
        job_dir = sweep / str(num)
        results = json.loads((job_dir / "eval_results.json").read_text())
        expected.append((str(num), "0", f"{results['metrics']['eval/pass@1']:.6g}", str(job_dir)))
    assert got == expected
    for run in runs:  # left as they were
        assert run.joinpath("metrics.jsonl").read_text().count("\n") == 2
