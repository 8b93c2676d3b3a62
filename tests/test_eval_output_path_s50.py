"""``eval.output_file`` that names a directory by its trailing slash (``results/``) is refused
as an existing directory is: ``Path`` dropped the slash, and the results were written to a
FILE named ``results`` (its samples to ``results.samples.jsonl``)."""

from __future__ import annotations

import pytest

import skyrl
from skyrl.config import ConfigError
from skyrl.eval_cli import evaluate


@pytest.mark.parametrize("name", ["results/", "sub/results/", "results//"])
def test_an_output_file_ending_in_a_slash_is_refused_before_any_work(tmp_path, name):
    target = f"{tmp_path}/{name}"  # a str: Path would drop the slash
    cfg = skyrl.compose(["experiment=smoke", f"eval.output_file={target}"])
    with pytest.raises(ConfigError) as err:
        evaluate(cfg, tmp_path / "run")
    assert err.value.key == "eval.output_file"
    folder = target.rstrip("/")
    assert err.value.message == (
        f"{target}: names a directory (it ends in /); name a file, e.g. {folder}/eval_results.json"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing else written
    assert list((tmp_path / "run").iterdir()) == []


def test_the_file_a_directory_name_suggests_is_taken(tmp_path):
    """The suggestion works: the same directory with the file name is not refused for it
    (refused later only for the missing eval prompts, which needs no weights)."""
    cfg = skyrl.compose(
        [
            "experiment=smoke",
            f"eval.output_file={tmp_path}/results/eval_results.json",
            "data.num_eval_prompts=0",
        ]
    )
    with pytest.raises(ConfigError) as err:
        evaluate(cfg, tmp_path / "run")
    assert err.value.key == "data.num_eval_prompts"
