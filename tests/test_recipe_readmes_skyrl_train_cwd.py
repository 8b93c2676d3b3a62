"""The custom_loss and react_agent recipes name modules under ``recipes.`` (``imports:``,
``generator.agent``); their READMEs said the ``skyrl-train`` script needs ``PYTHONPATH=.`` for
them. It does not: validation imports from the working directory, as ``python -m`` does, and
the workers from the driver's (``env -u PYTHONPATH .venv/bin/skyrl-train experiment=custom_loss
model.path=skyrl-tiny generator=hf trainer.total_steps=1`` from the repo root trained its step
on 2 workers, rc 0). The READMEs now say both commands work from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKYRL_TRAIN = Path(sys.executable).parent / "skyrl-train"


@pytest.mark.parametrize("experiment", ["custom_loss", "react_agent"])
def test_skyrl_train_runs_the_recipe_from_the_repo_root_without_pythonpath(tmp_path, experiment):
    if not SKYRL_TRAIN.exists():
        pytest.fail(f"{SKYRL_TRAIN} is missing: the package is not installed in this venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [str(SKYRL_TRAIN), f"experiment={experiment}", "model.path=skyrl-tiny"]
    command += ["trainer.dry_run=true", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    readme = (REPO / "recipes" / experiment / "README.md").read_text()
    assert "PYTHONPATH=." not in readme
    assert "`python -m skyrl` or the `skyrl-train` script" in " ".join(readme.split())
