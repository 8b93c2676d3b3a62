"""A ``skyrl-eval`` sweep whose config sets ``trainer.output_dir`` (an experiment's, or
``trainer.output_dir=outs/${hydra:job.num}``): the evals write ``eval_results.json`` in their
Hydra job dirs, as ever, but the summary looked for it in the recorded trainer output dir
(where nothing was written) and left every job's ``eval/pass@1`` empty."""

from __future__ import annotations

import csv
import json

from omegaconf import OmegaConf

from skyrl.sweeps import JOB_OUTPUT_DIR, write_summary


def test_an_eval_jobs_results_in_its_job_dir_are_read(tmp_path):
    sweep = tmp_path / "sweep"
    for num, pass_at_1 in ((0, 0.25), (1, 0.5)):  # 1 of 4 prompts pass, 2 of 4
        job_dir = sweep / str(num)
        (job_dir / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create([f"data.num_eval_prompts={num + 1}"]),
                       job_dir / ".hydra" / "overrides.yaml")  # fmt: skip
        OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}),
                       job_dir / ".hydra" / "hydra.yaml")  # fmt: skip
        # as the callback records it at the job's start: trainer.output_dir, never written
        (job_dir / JOB_OUTPUT_DIR).write_text(str(tmp_path / "outs" / str(num)))
        results = {"metrics": {"eval/pass@1": pass_at_1}}
        (job_dir / "eval_results.json").write_text(json.dumps(results))
        (job_dir / "job_return.json").write_text(
            json.dumps({"status": "ok", "objective": pass_at_1, "error": ""})
        )
    csv_path, _ = write_summary(sweep)
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["steps"], r["eval/pass@1"]) for r in rows] == [
        ("0", "0", "0.25"),
        ("1", "0", "0.5"),
    ]
    assert not (tmp_path / "outs").exists()
