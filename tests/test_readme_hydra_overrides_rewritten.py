"""The README's way to rerun a saved run, ``skyrl.compose(OmegaConf.load("<run dir>/.hydra/
overrides.yaml"))``, composes the overrides of the LAST command run in that dir: Hydra
rewrites ``.hydra/`` at every command. After ``experiment=smoke`` trained in a dir, a dry run
there with ``trainer.total_steps=5`` left ``[experiment=smoke, trainer.dry_run=true,
trainer.total_steps=5]`` in it, and the recipe composed a dry run of 5 steps. The README said
the run dir keeps the run's overrides, and that a dry run there leaves the run's files alone;
it now says what Hydra rewrites."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

import skyrl

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def dry_run(run_dir: Path, *overrides: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "skyrl", f"hydra.run.dir={run_dir}", *overrides]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_later_command_in_the_dir_rewrites_the_overrides_the_readme_composes(tmp_path):
    run_dir = tmp_path / "run"
    dry_run(run_dir, "experiment=smoke", "trainer.dry_run=true")
    dry_run(run_dir, "experiment=smoke", "trainer.dry_run=true", "trainer.total_steps=5")
    saved = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
    # the second command's, not the first's: what the README's recipe composes
    assert list(saved) == ["experiment=smoke", "trainer.dry_run=true", "trainer.total_steps=5"]
    assert skyrl.compose(saved).trainer.total_steps == 5

    text = " ".join(README.read_text().split())
    assert "Hydra rewrites that file at every command run in the dir" in text
    assert "(not `.hydra/`: Hydra writes the dry run's config and overrides there)" in text


def test_a_run_given_trainer_output_dir_alone_has_no_hydra_dir_there(tmp_path):
    # Hydra's run dir (outputs/<date>/<time>/ under the working directory) gets .hydra/;
    # trainer.output_dir, the run dir the README also resumes by, does not
    output_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "skyrl", "experiment=smoke", "trainer.dry_run=true"]
    command.append(f"trainer.output_dir={output_dir}")
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (output_dir / "resolved_config.yaml").exists()
    assert not (output_dir / ".hydra").exists()
    assert [p.name for p in tmp_path.glob("outputs/*/*/.hydra")] == [".hydra"]

    text = " ".join(README.read_text().split())
    assert "a run given `trainer.output_dir` alone has no `.hydra/` there" in text
