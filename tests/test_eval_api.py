"""``skyrl.evaluate`` from Python: its ``output_dir`` argument, its config argument, and a
run or checkpoint named as ``model.path`` (tiny evals: 1 prompt x 1 sample)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from added_tokens import tokenizer_with_added_tokens
from omegaconf import OmegaConf

import skyrl
from skyrl.config import ConfigError

SKYRL_EVAL = str(Path(sys.executable).parent / "skyrl-eval")
TINY = ["experiment=smoke", "data.num_eval_prompts=1", "generator.eval_n_samples_per_prompt=1"]


def test_a_leading_tilde_in_output_dir_is_the_home_directory(tmp_path, monkeypatch):
    """As for ``skyrl.train``'s output_dir: ``~/evals`` is under $HOME, not ``./~/evals``."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    result = skyrl.evaluate(skyrl.compose(TINY), "~/evals")
    assert result.output_file == home / "evals" / "eval_results.json"
    assert result.samples_file == home / "evals" / "eval_results.samples.jsonl"
    assert json.loads(result.output_file.read_text())["num_prompts"] == {"arithmetic": 1}
    assert not (cwd / "~").exists()


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_output_dir_that_is_a_file_is_one_config_error(tmp_path, below):
    """Not ``FileExistsError: [Errno 17] File exists`` from mkdir: the argument and the file."""
    afile = tmp_path / "afile"
    afile.write_text("kept\n")
    with pytest.raises(ConfigError) as caught:
        skyrl.evaluate(skyrl.compose(TINY), afile / below if below else afile)
    assert caught.value.key == "output_dir"
    assert caught.value.message == f"{afile} is a file, not a directory"
    assert afile.read_text() == "kept\n"


@pytest.mark.parametrize(
    "cfg", [{"model": {"path": "skyrl-tiny"}}, OmegaConf.create({"model": {"path": "skyrl-tiny"}})]
)
def test_a_config_not_made_by_compose_is_a_type_error_saying_so(cfg, tmp_path):
    """Not ``AttributeError: 'dict' object has no attribute '_get_node'`` (a dict) or
    ``ConfigKeyError: Missing key trainer`` (a DictConfig without the schema)."""
    with pytest.raises(TypeError, match=r"^skyrl\.evaluate takes a config made by skyrl\.compose"):
        skyrl.evaluate(cfg, tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("layout", "what"),
    [
        ("checkpoints/global_step_2/trainer_state.json", "a training run"),
        ("final_hf/config.json", "a training run"),
        ("trainer_state.json", "a checkpoint"),
        ("global_step_2/trainer_state.json", "a run's checkpoints directory"),
    ],
)
def test_a_run_or_checkpoint_as_model_path_points_to_eval_checkpoint(tmp_path, layout, what):
    """Was ``model.path: cannot load a tokenizer from <run>: ValueError: Couldn't instantiate
    the backend tokenizer ...``: it names the directory and the key that evaluates it."""
    target = tmp_path / "run"
    (target / layout).parent.mkdir(parents=True, exist_ok=True)
    (target / layout).write_text("{}")
    with pytest.raises(ConfigError) as caught:
        skyrl.evaluate(skyrl.compose([*TINY, f"model.path={target}"]), tmp_path / "out")
    assert caught.value.key == "model.path"
    assert caught.value.message == (
        f"{target}: {what}, not a model directory (config.json); evaluate it with "
        f"eval.checkpoint={target}"
    )


def test_skyrl_eval_of_a_run_as_model_path_is_one_line(tmp_path):
    """The command line ends in the same line (exit 2, no traceback)."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    cmd = [SKYRL_EVAL, "experiment=smoke", "model.path=run"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "error: model.path: run: a training run, not a model directory (config.json); "
        "evaluate it with eval.checkpoint=run"
    ]


def test_a_tokenizer_larger_than_the_models_vocab_is_refused_before_any_weights(tmp_path):
    # as skyrl-train's pre-flight refuses it: 2 added tokens give ids vocab_size and
    # vocab_size + 1, which have no embedding row
    folder, vocab_size = tokenizer_with_added_tokens(tmp_path, 2)
    cfg = skyrl.compose(["experiment=smoke", f"model.tokenizer_path={folder}"])
    with pytest.raises(ConfigError) as err:
        skyrl.evaluate(cfg, tmp_path / "eval")
    assert (err.value.key, err.value.message) == (
        "model.tokenizer_path",
        f"the tokenizer (model.tokenizer_path) has {vocab_size + 2} tokens, added ones included, "
        f"but model.path's vocab_size is {vocab_size}: ids {vocab_size} to {vocab_size + 1} "
        "have no embedding row",
    )
