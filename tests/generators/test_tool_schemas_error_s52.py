"""An env whose ``tool_schemas`` raises (a user env's own code: a registry it cannot reach,
say). At load the check called it outside any handler but ``ValueError``'s: a traceback wall
ending in the env's ``RuntimeError``; in the loop it ran unguarded before ``init``, so a
schema call that fails on some trajectories only stopped the whole run. Now the load check
refuses the env in one line naming ``environment._target_`` and the loop ends that
trajectory as an env error."""

import logging
import os
import subprocess
import sys
from pathlib import Path

from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.inference.base import SamplingParams

REPO = Path(__file__).resolve().parents[2]


class FlakyTools(TextEnv):
    """Declares no tools, except that the schema lookup fails on the rows that say so."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fails = False

    def init(self, prompt, extras):
        return super().init(prompt, extras)

    def tool_schemas(self):
        if self.fails:
            raise RuntimeError("schema registry unreachable")
        return None

    def step(self, action_text):
        return StepResult([], 1.0, True)


def test_a_tool_schema_call_that_raises_ends_its_trajectory_as_an_env_error(tok, caplog):
    built: list[FlakyTools] = []

    def factory():
        env = FlakyTools()
        env.fails = len(built) == 1  # the second trajectory's env
        built.append(env)
        return env

    rows = [PromptRow("a", "s", {}, uid="p0"), PromptRow("b", "s", {}, uid="p1")]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), factory, False).generate(rows, 1, SamplingParams())
    assert sorted(zip(out.stop_reasons, out.rewards, strict=True)) == [
        ("env_error", 0.0),
        ("stop", 1.0),
    ]
    assert out.metrics["env/errors"] == 1
    lines = [r.getMessage() for r in caplog.records if "tool_schemas" in r.getMessage()]
    assert lines == [
        "FlakyTools.tool_schemas: raised RuntimeError: schema registry unreachable; its trajectory "
        "ends with reward 0 (env_error)"
    ]


ENV_MODULE = """
from skyrl.envs.math_env import MathEnv


class BadTools(MathEnv):
    def tool_schemas(self):
        raise RuntimeError("schema registry unreachable")
"""


def test_the_load_check_refuses_an_env_whose_tool_schemas_raises_in_one_line(tmp_path):
    (tmp_path / "badtools.py").write_text(ENV_MODULE)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    done = subprocess.run(
        [sys.executable, "-m", "skyrl", "experiment=smoke", "trainer.dry_run=true",
         "environment._target_=badtools.BadTools", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "error: environment._target_: declaring the env's tools failed: RuntimeError: "
        "schema registry unreachable"
    )
    assert "Traceback" not in done.stderr
