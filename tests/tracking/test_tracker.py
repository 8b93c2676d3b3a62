"""Tracker: logger names, a registered sink, missing optional packages, close semantics."""

from __future__ import annotations

import json
import sys

import pytest

from skyrl.tracking import Tracker


def test_unknown_logger_is_named_before_anything_is_created(tmp_path):
    with pytest.raises(
        ValueError, match=r"^unknown logger 'tensorbord'; registered: console, jsonl, .*wandb$"
    ):
        Tracker(["console", "tensorbord"], output_dir=tmp_path / "run", total_steps=1)
    assert not (tmp_path / "run").exists()


def test_a_registered_sink_gets_every_step_as_jsonl_does(tmp_path):
    import recipe_plugins  # tests/ is on sys.path (rootdir conftest); registers "recording"

    with Tracker(["console", "recording"], output_dir=tmp_path, total_steps=2) as tracker:
        tracker.log(1, {"generate/reward_mean": 0.25, "policy/optimizer_steps": 2})
        tracker.log(2, {"generate/reward_mean": 0.5, "policy/optimizer_steps": 2})
    recorded = (tmp_path / recipe_plugins.RECORDING_FILE).read_text()
    assert recorded == (tmp_path / "metrics.jsonl").read_text()
    assert [json.loads(line) for line in recorded.splitlines()] == [
        {"step": 1, "generate/reward_mean": 0.25, "policy/optimizer_steps": 2.0},
        {"step": 2, "generate/reward_mean": 0.5, "policy/optimizer_steps": 2.0},
    ]


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


class StatusSink:
    """Records how it was closed; its ``close`` takes ``failed`` as the built-in sinks' does."""

    def __init__(self) -> None:
        self.closed_failed: list[bool] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        self.closed_failed.append(failed)


@pytest.mark.parametrize("failed", [False, True])
def test_close_tells_each_sink_whether_the_run_failed(tmp_path, failed):
    """``failed`` reaches sinks whose ``close`` takes it; a recipe sink with a plain ``close()``
    (the earlier protocol: ``recipe_plugins.RecordingSink``) is still closed."""
    import recipe_plugins  # noqa: F401  (tests/ is on sys.path; registers "recording")

    tracker = Tracker(["recording"], output_dir=tmp_path, total_steps=1)
    jsonl, recording = tracker.sinks
    status = StatusSink()
    tracker.sinks.append(status)
    tracker.close(failed=failed)
    assert status.closed_failed == [failed]
    assert jsonl.file.closed and recording.file.closed


def test_leaving_the_with_block_on_an_error_closes_as_failed(tmp_path):
    status = StatusSink()
    with pytest.raises(KeyError), Tracker([], output_dir=tmp_path, total_steps=1) as tracker:
        tracker.sinks.append(status)
        raise KeyError("boom")
    assert status.closed_failed == [True]
