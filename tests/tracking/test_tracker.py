"""Tracker: logger names, a registered sink, missing optional packages, close semantics."""

from __future__ import annotations

import json
import re
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


@pytest.mark.parametrize(("value", "shown"), [("abc", "'abc'"), (None, "None"), ([1, 2], "[1, 2]")])
def test_a_value_that_is_not_a_number_is_named_with_its_step(tmp_path, value, shown):
    """Was ``could not convert string to float: 'abc'`` (or a ``TypeError``) naming neither the
    metric nor the step; nothing of the refused step is written."""
    tracker = Tracker([], output_dir=tmp_path, total_steps=2)
    tracker.log(1, {"x": 1.0})
    message = rf"^metric 'env/info' at step 2 is not a number: {re.escape(shown)}$"
    with pytest.raises(TypeError, match=message):
        tracker.log(2, {"x": 2.0, "env/info": value})
    tracker.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "x": 1.0}\n'


def test_a_numpy_step_is_written_as_an_int_and_a_fractional_step_is_refused(tmp_path):
    """``np.int64`` steps failed in the jsonl sink (``Object of type int64 is not JSON
    serializable``); ``2.5`` was written as ``"step": 2.5``."""
    import numpy as np

    with Tracker([], output_dir=tmp_path, total_steps=3) as tracker:
        tracker.log(np.int64(1), {"x": 1.0})
        with pytest.raises(TypeError, match=r"^step must be an integer, got 2\.5$"):
            tracker.log(2.5, {"x": 2.0})
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "x": 1.0}\n'


def test_loggers_given_as_one_string_is_refused_as_such(tmp_path):
    """Was ``unknown logger 'w'``: the string was read letter by letter."""
    with pytest.raises(
        TypeError, match=r"^loggers must be a list of logger names, got the string 'wandb'"
    ):
        Tracker("wandb", output_dir=tmp_path / "run", total_steps=1)
    assert not (tmp_path / "run").exists()


def test_an_output_dir_that_is_a_file_or_under_one_names_the_file(tmp_path):
    """Was ``[Errno 17] File exists`` / ``[Errno 20] Not a directory`` naming the run dir."""
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    with pytest.raises(NotADirectoryError, match=rf"^output_dir {file} is a file, not a dir"):
        Tracker([], output_dir=file, total_steps=1)
    with pytest.raises(
        NotADirectoryError, match=rf"^output_dir {file}/run is under a file: {file}$"
    ):
        Tracker([], output_dir=file / "run", total_steps=1)
    assert file.read_text() == "kept\n"


def test_a_tracker_that_fails_to_start_leaves_no_empty_metrics_file(tmp_path, monkeypatch):
    """Was an empty metrics.jsonl, which the next try moved aside as an empty
    metrics.jsonl.1 (then .2, ...). A file with records stays: an earlier run's, moved aside,
    and a resumed run's."""
    monkeypatch.setitem(sys.modules, "mlflow", None)  # the backend that will not start
    for _ in range(2):
        with pytest.raises(ImportError):
            Tracker(["mlflow"], output_dir=tmp_path, total_steps=1)
    assert list(tmp_path.iterdir()) == []

    earlier = '{"step": 1, "x": 1.0}\n'
    (tmp_path / "metrics.jsonl").write_text(earlier)
    with pytest.raises(ImportError):  # a fresh run: the earlier run's records go aside, kept
        Tracker(["mlflow"], output_dir=tmp_path, total_steps=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl.1"]
    (tmp_path / "metrics.jsonl.1").rename(tmp_path / "metrics.jsonl")
    with pytest.raises(ImportError):  # a resumed run: its records stay where they are
        Tracker(["mlflow"], output_dir=tmp_path, total_steps=2, start_step=1)
    assert (tmp_path / "metrics.jsonl").read_text() == earlier


def test_a_run_that_fails_before_its_first_record_leaves_no_empty_metrics_file(tmp_path):
    """A failed close with nothing written removes the empty file; a normal one keeps it (the
    end-of-run summary reads it)."""
    Tracker([], output_dir=tmp_path / "failed", total_steps=1).close(failed=True)
    assert list((tmp_path / "failed").iterdir()) == []
    Tracker([], output_dir=tmp_path / "ok", total_steps=1).close()
    assert (tmp_path / "ok" / "metrics.jsonl").read_text() == ""
