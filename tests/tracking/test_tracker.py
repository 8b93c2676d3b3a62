"""Tracker: logger names, missing optional packages, close semantics."""

from __future__ import annotations

import sys

import pytest

from skyrl.tracking import Tracker


def test_unknown_logger_is_named_before_anything_is_created(tmp_path):
    with pytest.raises(ValueError, match=r"unknown logger\(s\) \['tensorbord'\]; choose from"):
        Tracker(["console", "tensorbord"], output_dir=tmp_path / "run", total_steps=1)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("logger", ["tensorboard", "wandb", "mlflow"])
def test_missing_package_says_what_to_install(tmp_path, monkeypatch, logger):
    monkeypatch.setitem(sys.modules, logger, None)  # makes `import <logger>` fail
    with pytest.raises(ImportError, match=f"logger '{logger}' needs .* pip install {logger}"):
        Tracker([logger], output_dir=tmp_path, total_steps=1)


def test_jsonl_listed_twice_writes_once_and_close_is_idempotent(tmp_path):
    tracker = Tracker(["jsonl", "jsonl"], output_dir=tmp_path, total_steps=1)
    tracker.log(1, {"x": 1})
    tracker.close()
    tracker.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "x": 1.0}\n'
    with pytest.raises(RuntimeError, match="after close"):
        tracker.log(2, {"x": 2})


def test_context_manager_closes_on_error(tmp_path):
    with pytest.raises(KeyError), Tracker([], output_dir=tmp_path, total_steps=1) as tracker:
        raise KeyError("boom")
    assert tracker.closed
