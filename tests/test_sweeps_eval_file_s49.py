"""A ``skyrl-eval`` sweep whose jobs each write their own ``eval.output_file`` (the per-job name
the one-file-for-all refusal suggests, ``r_${hydra:job.num}.json``): the summary reads each
job's pass@1 from that file. Before, it looked for ``eval_results.json`` in the job dir only,
and ``summary.csv``'s ``eval/pass@1`` was empty for every job (read as "never evaluated")."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from skyrl.sweeps import SweepSummary

SKYRL_EVAL = str(Path(sys.executable).parent / "skyrl-eval")


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def eval_job(sweep_dir: Path, num: int, overrides: list[str]) -> Path:
    """A job directory as Hydra leaves a ``skyrl-eval`` job's: .hydra/*.yaml, no metrics."""
    job_dir = sweep_dir / str(num)
    (job_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job_dir / ".hydra" / "overrides.yaml")
    OmegaConf.save(
        OmegaConf.create({"hydra": {"job": {"num": num}}}), job_dir / ".hydra" / "hydra.yaml"
    )
    return job_dir


def test_each_jobs_own_output_file_gives_its_pass_at_1(tmp_path, monkeypatch):
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from hydra.types import RunMode

    setup_globals()  # registers the ``hydra:`` resolver, as Hydra's main does
    monkeypatch.chdir(tmp_path)  # a relative output file is taken from here, as skyrl-eval does
    sweep_dir = tmp_path / "multirun"
    output_file = "res/r_${hydra:job.num}.json"
    (tmp_path / "res").mkdir()
    stale = {"metrics": {"eval/pass@1": 0.5}}  # an earlier sweep's job 2, whose eval fails now
    (tmp_path / "res" / "r_2.json").write_text(json.dumps(stale))
    os.utime(tmp_path / "res" / "r_2.json", (0, 0))
    callback = SweepSummary()
    try:
        # job 0: 1 pass of 4 samples -> pass@1 0.25; job 1: 3 of 4 -> 0.75
        for num, pass_at_1 in ((0, 0.25), (1, 0.75), (2, None)):
            # Hydra's overrides.yaml keeps a sweep job's interpolation escaped
            escaped = output_file.replace("${hydra:", "$\\{hydra\\:").replace("}", "\\}")
            job_dir = eval_job(sweep_dir, num, [f"eval.output_file={escaped}"])
            hydra = OmegaConf.merge(HydraConf(), {"mode": RunMode.MULTIRUN, "job": {"num": num},
                                    "runtime": {"output_dir": str(job_dir)},
                                    "sweep": {"dir": str(sweep_dir)}})  # fmt: skip
            config = OmegaConf.create({"hydra": hydra, "eval": {"output_file": output_file}})
            HydraConfig.instance().set_config(config)  # as Hydra's run_job does for each job
            callback.on_job_start(config=config, task_function=None)
            ret = JobReturn()
            if pass_at_1 is None:
                ret.status, ret._return_value = JobStatus.FAILED, RuntimeError("engine died")
            else:  # what the job's eval wrote
                results = {"metrics": {"eval/pass@1": pass_at_1}}
                (tmp_path / "res" / f"r_{num}.json").write_text(json.dumps(results))
                ret.status, ret._return_value = JobStatus.COMPLETED, pass_at_1
            callback.on_job_end(config, ret)
        HydraConfig.instance().cfg = None  # none at the end of the multirun
        callback.on_multirun_end(config)
    finally:
        HydraConfig.instance().cfg = None
    rows = read_csv(sweep_dir / "summary.csv")
    assert [(r["job"], r["status"], r["steps"], r["eval/pass@1"]) for r in rows] == [
        ("0", "ok", "0", "0.25"),
        ("1", "ok", "0", "0.75"),
        ("2", "failed", "0", ""),  # not the earlier sweep's 0.5 its file still holds
    ]


@pytest.mark.slow
def test_an_eval_sweep_with_per_job_output_files_has_its_pass_at_1(tmp_path):
    """The real CLI: two evals of the tiny model, each writing ``r_<job>.json``; each row's
    pass@1 is the one its results file holds."""
    result = subprocess.run(
        [SKYRL_EVAL, "-m", "hydra.sweep.dir=sweep", "experiment=smoke",
         "data.num_eval_prompts=1,2", "generator.eval_n_samples_per_prompt=1",
         "eval.output_file=res/r_${hydra:job.num}.json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_csv(tmp_path / "sweep" / "summary.csv")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    for num, row in enumerate(rows):
        record = json.loads((tmp_path / "res" / f"r_{num}.json").read_text())
        assert row["eval/pass@1"] == f"{record['metrics']['eval/pass@1']:.6g}"
