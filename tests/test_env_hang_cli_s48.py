"""Env calls hung past ``environment.max_hung_calls`` end ``skyrl-train`` and ``skyrl-eval``
with one ``error:`` line and exit 1, as a dead worker or engine does; it was Hydra's
traceback of ``EnvHangError`` (the message itself already said what to fix)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
HANGING_ENV = """
import time
from skyrl.envs.base import StepResult, TextEnv

class Hang(TextEnv):
    def step(self, action_text):
        time.sleep(20)
        return StepResult([], 1.0, True)
"""


@pytest.mark.parametrize("command", ["skyrl-train", "skyrl-eval"])
def test_hung_env_calls_end_the_run_in_one_line(tmp_path, command):
    (tmp_path / "hang_env_s48.py").write_text(HANGING_ENV)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    args = [
        str(BIN / command), "experiment=smoke", "environment._target_=hang_env_s48.Hang",
        "environment.timeout_s=0.5", "environment.max_hung_calls=1", "hydra.run.dir=run",
        "trainer.total_steps=1",
    ]  # fmt: skip
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 2 env calls are still running past environment.timeout_s=0.5")
    assert "environment.max_hung_calls=1" in last
