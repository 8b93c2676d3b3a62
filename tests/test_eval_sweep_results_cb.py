"""``skyrl-eval``'s results: the jobs of a sweep do not write them over each other's, and
the printed table tells a source named ``all`` from the overall row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import skyrl
from skyrl import eval_cli
from skyrl.config.validate import validate
from skyrl.eval_cli import EvalResult, format_eval_table


def check(monkeypatch, argv: list[str]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["skyrl-eval", *argv])
    eval_cli._check_command_line()  # exits 2 with one line on a problem


def test_a_sweep_with_one_output_file_for_every_job_is_one_line(monkeypatch, capsys):
    """Each job wrote ``r.json`` (and ``r.samples.jsonl``) over the one before: after the
    sweep only the last job's results were left, while every job had printed
    ``results: r.json``."""
    argv = ["-m", "experiment=smoke", "generator.eval_sampling.temperature=0.5,1.0"]
    with pytest.raises(SystemExit) as exited:
        check(monkeypatch, [*argv, "eval.output_file=r.json"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: eval.output_file: r.json: every job of the sweep writes its results there "
        "(and its samples to r.samples.jsonl), each over the last one's; leave it unset "
        "(each job's own directory) or make it per job, e.g. "
        "eval.output_file=r_${hydra:job.num}.json"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        # one file per job: swept, or named after the job
        ["generator.eval_sampling.temperature=0.5,1.0", "eval.output_file=a.json,b.json"],
        ["generator.eval_sampling.temperature=0.5,1.0", "eval.output_file=r_${hydra:job.num}.json"],
        ["eval.output_file=r.json"],  # a sweep of one job
    ],
)
def test_a_sweep_with_an_output_file_per_job_passes(monkeypatch, argv):
    check(monkeypatch, ["-m", "experiment=smoke", *argv])


def test_a_source_named_all_is_told_from_the_overall_row():
    """``data.eval_files=[all.jsonl, b.jsonl]``: the source ``all`` and the overall row were
    both printed as ``all``, with different numbers."""
    cfg = validate(skyrl.compose(["experiment=smoke", "generator.eval_n_samples_per_prompt=1"]))
    metrics = {"eval/pass@1": 0.25, "eval/reward_mean": 0.25}  # 1 pass of 4 prompts
    metrics |= {"eval/all/pass@1": 0.5, "eval/all/reward_mean": 0.5}  # 1 of 2
    metrics |= {"eval/b/pass@1": 0.0, "eval/b/reward_mean": 0.0}  # 0 of 2
    result = EvalResult("m", metrics, {"all": 2, "b": 2}, Path("/r.json"), Path("/s.jsonl"))
    assert format_eval_table(result, cfg).splitlines()[1:-1] == [
        "source  prompts  samples       pass@1  reward_mean",
        "all           2        2        0.500        0.500",
        "b             2        2        0.000        0.000",
        "(all)         4        4        0.250        0.250",
    ]
