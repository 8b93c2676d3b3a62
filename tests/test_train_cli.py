"""The real `skyrl-train` entry point, run in a subprocess from a foreign directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")


def run_cli(
    tmp_path: Path, *args: str, module: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "skyrl", *args] if module else [SKYRL_TRAIN, *args]
    env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.lr_typo=1", "error: trainer.lr_typo: unknown key"),
        (
            "trainer.trian_batch_size=1",
            "error: trainer.trian_batch_size: unknown key (did you mean 'train_batch_size'?)",
        ),
        (
            "trainer.train_batch_size=abc",
            "error: trainer.train_batch_size: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        ("algorithm=nope", "error: algorithm=nope: no such option in group 'algorithm'"),
        ("trainer.train_batch_size=-4", "error: trainer.train_batch_size: must be >= 1, got -4"),
        (
            "trainer.train_batch_size=10",
            "error: trainer.policy_mini_batch_size: train_batch_size (10) must be divisible by policy_mini_batch_size (4)",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, override, expected):
    result = run_cli(tmp_path, override)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [lines[0]], f"expected one line, got:\n{result.stderr}"
    assert lines[0].startswith(expected)
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "outputs").exists(), "a rejected command must not create a run dir"


@pytest.mark.parametrize(("key", "module"), [("model.path", False), ("model.tokenizer_path", True)])
def test_unresolvable_model_is_an_error_not_a_traceback(tmp_path, key, module):
    result = run_cli(
        tmp_path,
        "experiment=smoke",
        f"{key}=Nope/NotAModel",
        "trainer.output_dir=run",
        module=module,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    error = result.stderr.strip().splitlines()  # the model is resolved before Ray starts
    assert error[0] == f"error: {key}='Nope/NotAModel' could not be resolved. Tried:"
    tried = error[1:]  # indented: local directory, HF cache, hub (skipped offline), the fix
    assert all(line.startswith("  ") for line in tried)
    assert "local directory" in tried[0] and "HF cache" in tried[1]
    assert "HF hub: skipped (HF_HUB_OFFLINE" in tried[2]
    assert tried[-1].startswith("  Fix: ") and f"set {key} to a local directory" in tried[-1]


def test_unknown_option_lists_available(tmp_path):
    result = run_cli(tmp_path, "algorithm=grp")
    assert result.returncode == 2
    assert "(did you mean 'grpo'?)" in result.stderr
    assert "available: " in result.stderr and "grpo" in result.stderr.split("available: ")[1]


def test_cfg_job_prints_composed_config(tmp_path):
    result = run_cli(tmp_path, "--cfg", "job", "trainer.train_batch_size=32")
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert set(cfg) >= {"trainer", "generator", "algorithm", "environment", "data", "model"}
    assert cfg["trainer"]["train_batch_size"] == 32
    assert cfg["algorithm"]["advantage_estimator"] == "grpo"


def test_help_lists_groups(tmp_path):
    result = run_cli(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    for group in ("trainer:", "generator:", "algorithm:", "environment:", "data:"):
        assert group in result.stdout


def test_dry_run_prints_plan_and_saves_resolved_config(tmp_path):
    result = run_cli(tmp_path, "trainer.dry_run=true", "hydra.run.dir=run0", module=True)
    assert result.returncode == 0, result.stderr
    # 16 prompts / 8 per mini-batch = 2 mini-batches x 1 epoch = 2 optimizer steps
    plan = {
        line.split("  ")[1]: line.split()[-1]
        for line in result.stdout.splitlines()
        if line.startswith("  ")
    }
    assert plan["optimizer steps / step"] == "2"
    saved = yaml.safe_load((tmp_path / "run0" / "resolved_config.yaml").read_text())
    assert saved["trainer"]["dry_run"] is True


def test_hydra_does_not_chdir(tmp_path):
    result = run_cli(
        tmp_path, "trainer.dry_run=true", "hydra.run.dir=elsewhere", "trainer.output_dir=rel_out"
    )
    assert result.returncode == 0, result.stderr
    # a relative output_dir resolves against the launch directory, not Hydra's run dir
    assert (tmp_path / "rel_out" / "resolved_config.yaml").exists()


def test_multirun_gives_each_job_its_own_dir(tmp_path):
    result = run_cli(
        tmp_path,
        "-m",
        "algorithm=grpo",
        "trainer.seed=1,2",
        "trainer.dry_run=true",
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 0, result.stderr
    seeds = sorted(
        yaml.safe_load((tmp_path / "sweep" / str(i) / "resolved_config.yaml").read_text())[
            "trainer"
        ]["seed"]
        for i in (0, 1)
    )
    assert seeds == [1, 2]


def test_multirun_checks_every_sweep_value_first(tmp_path):
    result = run_cli(
        tmp_path,
        "-m",
        "trainer.train_batch_size=16,abc",
        "trainer.dry_run=true",
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: trainer.train_batch_size: Value 'abc' of type 'str' could not be converted to Integer"
    )
    assert not (tmp_path / "sweep").exists(), "no job may start when one sweep value is invalid"
