"""Hydra's own flags given together that Hydra refuses (``-m --cfg job``, ``--resolve``
without ``--cfg``), and ``skyrl-serve -m``: one ``error:`` line naming the flags, exit 2,
from the real entry points in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(tmp_path: Path, command: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / command), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # before: a traceback ending "ValueError: Only one of --run, --multirun, --cfg, --info
        # and --shell_completion can be specified", exit 1
        (
            ["-m", "--cfg", "job", "trainer.seed=1,2"],
            "error: --multirun and --cfg: Hydra takes one of --run, --multirun, --cfg, --info, "
            "--shell-completion (to print a sweep job's config: --cfg job with its overrides, "
            "without -m)",
        ),
        (
            ["--cfg", "job", "--info", "config"],
            "error: --cfg and --info: Hydra takes one of --run, --multirun, --cfg, --info, "
            "--shell-completion",
        ),
        # before: a traceback ending "ValueError: The --resolve flag can only be used in
        # conjunction with --cfg or --help", exit 1
        (
            ["--resolve", "experiment=smoke"],
            "error: --resolve: only with --cfg (it resolves the config --cfg prints)",
        ),
    ],
)
def test_flags_hydra_refuses_together_are_one_line(tmp_path, args, expected):
    assert one_line(run(tmp_path, "skyrl-train", *args)) == expected
    assert not (tmp_path / "outputs").exists()


def test_skyrl_serve_refuses_a_sweep(tmp_path):
    # before: it served job 0's endpoint; Ctrl-C stopped that one and job 1's started
    line = one_line(run(tmp_path, "skyrl-serve", "-m", "serve.port=8001,8002"))
    assert line == (
        "error: --multirun: skyrl-serve serves one endpoint until it is stopped, so a sweep "
        "would serve its jobs one after another; start one skyrl-serve per config"
    )
    assert not (tmp_path / "outputs").exists()
