"""Hydra's own flags given together that Hydra refuses (``-m --cfg job``, ``--resolve``
without ``--cfg``), and ``skyrl-serve -m``: one ``error:`` line naming the flags, exit 2,
from the real entry points in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import one_line, run  # tests/ is on sys.path


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
        # before, these three: argparse's 7-line usage block, then its error line
        # ("unrecognized arguments: trainer.seed=1,2", overrides that are fine where they are)
        (
            ["experiment=smoke", "-m", "trainer.seed=1,2"],
            "error: trainer.seed=1,2: an override after a flag that follows other overrides; "
            "give Hydra's flags (-m, --cfg job, ...) before or after all the overrides",
        ),
        (
            ["--bogus", "experiment=smoke"],
            "error: --bogus: no such flag (--help lists the command's, --hydra-help Hydra's)",
        ),
        (
            ["--cfg", "jobb"],
            "error: --cfg/-c: invalid choice: 'jobb' (choose from 'job', 'hydra', 'all')",
        ),
    ],
)
@pytest.mark.parametrize("command", ["skyrl-train", "skyrl-eval"])
def test_flags_hydra_refuses_together_are_one_line(tmp_path, command, args, expected):
    # skyrl-eval before: the same tracebacks (its command-line check left the flags to Hydra)
    assert one_line(run(tmp_path, command, *args)) == expected
    assert not (tmp_path / "outputs").exists()


def test_skyrl_serve_names_a_misplaced_override(tmp_path):
    # before: argparse's usage block, then "unrecognized arguments: serve.port=8001"
    line = one_line(run(tmp_path, "skyrl-serve", "generator=hf", "--cfg", "job", "serve.port=8001"))
    assert line == (
        "error: serve.port=8001: an override after a flag that follows other overrides; give "
        "Hydra's flags (-m, --cfg job, ...) before or after all the overrides"
    )


def test_skyrl_serve_refuses_a_sweep(tmp_path):
    # before: it served job 0's endpoint; Ctrl-C stopped that one and job 1's started
    line = one_line(run(tmp_path, "skyrl-serve", "-m", "serve.port=8001,8002"))
    assert line == (
        "error: --multirun: skyrl-serve serves one endpoint until it is stopped, so a sweep "
        "would serve its jobs one after another; start one skyrl-serve per config"
    )
    assert not (tmp_path / "outputs").exists()


def _own_experiment(tmp_path: Path) -> Path:
    """A config dir holding ``experiment=mine`` (the tiny model, RLOO)."""
    experiment = tmp_path / "myconf" / "experiment" / "mine.yaml"
    experiment.parent.mkdir(parents=True)
    experiment.write_text(
        "# @package _global_\ndefaults:\n  - override /algorithm: rloo\n"
        "model:\n  path: skyrl-tiny\n"
    )
    return experiment.parent.parent


def test_a_typo_with_config_dir_is_one_line(tmp_path):
    # before: Hydra's "Could not override 'trainer.trian_batch_size'." with its "Key
    # 'trian_batch_size' not in 'TrainerConfig'" block and the HYDRA_FULL_ERROR hint, exit 1:
    # the command-line check skipped any command line with --config-dir
    conf = _own_experiment(tmp_path)
    line = one_line(
        run(
            tmp_path,
            "skyrl-train",
            f"--config-dir={conf}",
            "experiment=mine",
            "trainer.trian_batch_size=3",
        )
    )
    assert line == "error: trainer.trian_batch_size: unknown key (did you mean 'train_batch_size'?)"
    assert not (tmp_path / "outputs").exists()


def test_an_experiment_in_config_dir_runs(tmp_path):
    conf = _own_experiment(tmp_path)
    result = run(
        tmp_path,
        "skyrl-train",
        "--config-dir",
        str(conf),
        "experiment=mine",
        "trainer.dry_run=true",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [resolved] = (tmp_path / "outputs").glob("*/*/resolved_config.yaml")
    assert "advantage_estimator: rloo" in resolved.read_text()


@pytest.mark.parametrize("command", ["skyrl-train", "skyrl-eval"])
def test_a_missing_config_dir_is_one_line(tmp_path, command):
    # before: "Additional config directory '<dir>' not found", a blank line and the
    # HYDRA_FULL_ERROR hint, exit 1
    line = one_line(run(tmp_path, command, "--config-dir", "nope", "trainer.dry_run=true"))
    assert line == f"error: --config-dir: {tmp_path / 'nope'}: no such directory"


@pytest.mark.parametrize("command", ["skyrl-train", "skyrl-eval"])
def test_a_missing_config_path_is_one_line(tmp_path, command):
    # before: "Primary config directory not found.", "Check that the config directory '<dir>'
    # exists and readable", a blank line and the HYDRA_FULL_ERROR hint, exit 1
    missing = tmp_path / "nope"
    line = one_line(run(tmp_path, command, "--config-path", str(missing)))
    assert line == f"error: --config-path: {missing}: no such directory"


def test_a_relative_config_path_says_where_hydra_looks(tmp_path):
    # Hydra takes a relative --config-path from the module declaring @hydra.main (skyrl.cli):
    # before, "Primary config module 'skyrl.mine' not found." and two more lines, exit 1, for
    # a folder right there in the working directory
    (tmp_path / "mine").mkdir()
    line = one_line(run(tmp_path, "skyrl-train", "-cp", "mine"))
    assert line == (
        "error: --config-path: mine: no such folder in the skyrl package (skyrl.mine: Hydra "
        "reads a relative --config-path there, not in the working directory); for "
        f"{tmp_path / 'mine'}, give that absolute path"
    )


def test_a_config_path_without_the_primary_config_is_one_line(tmp_path):
    # before: "Cannot find primary config 'config'. Check that it's in your config search
    # path.", the search path (3 lines), the HYDRA_FULL_ERROR hint, exit 1
    line = one_line(run(tmp_path, "skyrl-train", "--config-path", str(tmp_path)))
    assert line == (
        f"error: --config-path: {tmp_path}: no config.yaml in it (the primary config; "
        "--config-name names another)"
    )
