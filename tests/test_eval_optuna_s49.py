"""``skyrl-eval -m hydra/sweeper=skyrl_optuna``: a search over the eval's sampling. Each trial's
eval ran and wrote its results, but ``skyrl-eval`` returned None where ``skyrl-train`` returns
its final pass@1: Optuna failed every trial ("Return value must be float-castable. Got
'None'") and the sweep ended in a traceback, ``ValueError: No trials are completed yet``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

SKYRL_EVAL = str(Path(sys.executable).parent / "skyrl-eval")


@pytest.mark.slow
def test_each_trial_returns_its_pass_at_1_to_optuna(tmp_path):
    result = subprocess.run(
        [SKYRL_EVAL, "-m", "hydra.sweep.dir=sweep", "hydra/sweeper=skyrl_optuna",
         "hydra.sweeper.n_trials=2", "experiment=smoke", "data.num_eval_prompts=1",
         "generator.eval_n_samples_per_prompt=1",
         "generator.eval_sampling.temperature=interval(0.5,1.0)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    sweep = tmp_path / "sweep"
    pass_at_1 = []
    for num in (0, 1):
        results = json.loads((sweep / str(num) / "eval_results.json").read_text())
        assert 0.5 <= results["sampling"]["temperature"] <= 1.0
        pass_at_1.append(results["metrics"]["eval/pass@1"])
        # the value the job returned is the one its results file holds
        record = json.loads((sweep / str(num) / "job_return.json").read_text())
        assert record == {"status": "ok", "objective": pass_at_1[-1], "error": ""}
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_value == max(pass_at_1)  # direction: maximize
    assert 0.5 <= best.best_params["generator.eval_sampling.temperature"] <= 1.0
