"""``skyrl.compose`` takes a path (``pathlib.Path``) as a mapping's value, written as its string:
the paths the API hands back (``TrainResult.output_dir``, ``final_hf``, ``checkpoint``,
``EvalResult.output_file``) go straight into the next config, as a notebook chains a run and
its eval. Before: ``skyrl.compose({"eval.checkpoint": result.output_dir})`` was a TypeError,
'eval.checkpoint is a PosixPath; a mapping's values are None, bool, int, float, str ...'."""

from __future__ import annotations

from pathlib import Path

import pytest

import skyrl
from skyrl.config.errors import ConfigError


def test_a_path_value_is_its_string(tmp_path):
    run = tmp_path / "my run"  # a space: quoted as a string is
    by_path = skyrl.compose({"experiment": "smoke", "eval.checkpoint": run})
    as_str = skyrl.compose({"experiment": "smoke", "eval.checkpoint": str(run)})
    assert by_path == as_str
    assert by_path.eval.checkpoint == str(run)


def test_paths_in_a_list_and_in_a_nested_mapping():
    files = [Path("/data/a.jsonl"), Path("rel/b,c.jsonl")]  # a comma: no sweep, no split
    cfg = skyrl.compose({"experiment": "smoke", "data": {"source": "files", "eval_files": files}})
    assert list(cfg.data.eval_files) == ["/data/a.jsonl", "rel/b,c.jsonl"]


def test_a_path_that_names_a_hydra_job_setting_is_still_refused(tmp_path):
    with pytest.raises(ConfigError) as caught:
        skyrl.compose({"experiment": "smoke", "hydra.run.dir": tmp_path})
    assert caught.value.key == "hydra.run.dir"


def test_other_objects_are_still_a_type_error():
    with pytest.raises(TypeError, match=r"eval.checkpoint is a object"):
        skyrl.compose({"experiment": "smoke", "eval.checkpoint": object()})
