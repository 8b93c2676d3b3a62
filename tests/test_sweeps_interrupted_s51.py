"""A sweep stopped by Ctrl-C still leaves a final summary.csv: the job that was running is
listed as failed, the jobs before it as they ended. Hydra calls ``on_multirun_end`` only for a
sweep that ran to its end, and no ``on_job_end`` for a job a ``KeyboardInterrupt`` stopped.

Before: ``skyrl-eval -m ...`` stopped by Ctrl-C in job 1 left the summary written after job
0 (``0,smoke,0.5,0,,,0,ok,,.../0``): job 1 had no row at all, and nothing said the sweep
stopped there; a job left without its end recorded showed ``running`` ever after."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from skyrl.envs import StepResult, TextEnv
from skyrl.sweeps import SweepSummary

SKYRL_EVAL = str(Path(sys.executable).parent / "skyrl-eval")
TESTS = Path(__file__).parent
UNRECORDED = "the job ended without recording a result (interrupted, killed or exited)"


class InterruptingEnv(TextEnv):
    """Scores 0; with ``interrupt`` the first step of all sends this process Ctrl-C's signal
    (once, as a user presses Ctrl-C once)."""

    interrupted = False

    def __init__(self, interrupt: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.interrupt = interrupt

    def step(self, action_text: str) -> StepResult:
        if self.interrupt and not InterruptingEnv.interrupted:
            InterruptingEnv.interrupted = True
            os.kill(os.getpid(), signal.SIGINT)
        return StepResult(observations=[], reward=0.0, done=True, info={})


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_an_eval_sweep_stopped_by_ctrl_c_lists_the_job_it_stopped(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    result = subprocess.run(
        [SKYRL_EVAL, "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "experiment=smoke",
         "environment._target_=test_sweeps_interrupted_s51.InterruptingEnv", "generator.max_generate_length=4",
         "+environment.kwargs.interrupt=false,true,false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "interrupted: the eval in progress wrote no results"
    )
    rows = read_csv(tmp_path / "sweep" / "summary.csv")
    assert [
        (r["job"], r["environment.kwargs.interrupt"], r["status"], r["error"]) for r in rows
    ] == [
        ("0", "False", "ok", ""),
        ("1", "True", "failed", UNRECORDED),
    ]  # job 2 never started
    assert not (tmp_path / "sweep" / "2").exists()


def test_a_sweep_that_ran_to_its_end_is_summarized_once(tmp_path, monkeypatch):
    """``on_multirun_end`` writes the final summary; nothing is written again at exit."""
    import atexit

    registered = []
    monkeypatch.setattr(atexit, "register", lambda f, *a: registered.append(f))
    monkeypatch.setattr(atexit, "unregister", registered.remove)
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback = SweepSummary()
    callback.on_multirun_start(config)
    assert callback._summarize_at_exit in registered
    callback.on_multirun_end(config)
    assert callback._summarize_at_exit not in registered
