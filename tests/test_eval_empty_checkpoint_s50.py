"""An empty ``eval.checkpoint`` (``eval.checkpoint=$RUN`` with ``RUN`` unset) was the working
directory (``Path("")`` is ``.``): run from inside a run directory, skyrl-eval evaluated that
run's ``final_hf`` without a word; elsewhere its error named an empty path (``eval.checkpoint:
: neither a run directory ...``)."""

from __future__ import annotations

import pytest

import skyrl
from skyrl.config import ConfigError
from skyrl.eval_cli import evaluate


@pytest.mark.parametrize("value", ["''", "' '"])
def test_an_empty_checkpoint_is_refused_naming_it(tmp_path, monkeypatch, value):
    run = tmp_path / "run"  # a run dir as the working directory: what "" would have named
    (run / "final_hf").mkdir(parents=True)
    (run / "final_hf" / "config.json").write_text("{}")
    (run / "final_hf" / "model.safetensors").write_text("")
    monkeypatch.chdir(run)
    cfg = skyrl.compose(["experiment=smoke", f"eval.checkpoint={value}"])
    with pytest.raises(ConfigError) as err:
        evaluate(cfg, tmp_path / "eval")
    assert (err.value.key, err.value.message) == (
        "eval.checkpoint",
        "is empty; name a run directory or a checkpoint, or leave it unset (null) to evaluate "
        "model.path",
    )
    assert not (tmp_path / "eval" / "eval_results.json").exists()
