"""MLflow sink: a local file store with params and per-step metrics, names sanitized."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from skyrl.config.errors import ConfigError
from skyrl.tracking import SINKS, Tracker
from skyrl.tracking.mlflow import MAX_PARAM_VALUE_CHARS, flatten, sanitize_name


def test_file_store_has_params_and_metrics(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    # set, then delete: monkeypatch then restores the original state after the sink sets it
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    config = {"trainer": {"lr": 1e-6, "seed": 3}, "prompt": "x" * 7000}
    with Tracker(["mlflow"], output_dir=tmp_path, total_steps=2, config=config, run_name="m") as t:
        t.log(0, {"eval/pass@1": 0.1})
        t.log(1, {"eval/pass@1": 0.3, "generate/reward_mean": float("nan")})

    client = MlflowClient(tracking_uri=f"file:{(tmp_path / 'mlruns').resolve()}")
    (run,) = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
    assert run.info.run_name == "m" and run.info.status == "FINISHED"
    assert run.data.params["trainer.lr"] == "1e-06"
    assert run.data.params["prompt"] == "x" * MAX_PARAM_VALUE_CHARS
    history = client.get_metric_history(run.info.run_id, "eval/pass_at_1")
    assert [(m.step, m.value) for m in history] == [(0, 0.1), (1, 0.3)]
    (reward,) = client.get_metric_history(run.info.run_id, "generate/reward_mean")
    assert math.isnan(reward.value)


def test_a_failed_run_is_marked_failed_and_a_finished_one_finished(tmp_path, monkeypatch):
    """The trainer closes the tracker in its ``finally``; a crashed run must not read FINISHED."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for name, failed in (("ok", False), ("failed", True)):
        tracker = Tracker(["mlflow"], output_dir=tmp_path, total_steps=2, run_name=name)
        tracker.log(1, {"generate/reward_mean": 0.5})
        tracker.close(failed=failed)
    with pytest.raises(RuntimeError, match="rank 0 died"):  # the reviewer's case: a with block
        with Tracker(["mlflow"], output_dir=tmp_path, total_steps=2, run_name="raised") as t:
            t.log(1, {"generate/reward_mean": 0.5})
            raise RuntimeError("rank 0 died at step 2")

    client = MlflowClient(tracking_uri=f"file:{(tmp_path / 'mlruns').resolve()}")
    runs = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {
        "ok": "FINISHED", "failed": "FAILED", "raised": "FAILED",
    }  # fmt: skip


def test_sanitize_name():
    assert sanitize_name("eval/pass@1") == "eval/pass_at_1"
    assert sanitize_name("a%b:c//d/") == "a_b_c/d"
    assert sanitize_name("ok/name-1.x y") == "ok/name-1.x y"


def test_flatten():
    assert list(flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None})) == [
        ("a.b", 1),
        ("a.c.d", [1, 2]),
        ("e", None),
    ]


def test_a_tracking_uri_mlflow_refuses_is_one_line_naming_it(tmp_path, monkeypatch):
    """Was mlflow's own exception raised from deep in its store registry: a traceback wall
    through ``skyrl-train`` (only a ``ConfigError`` ends a run in one line), naming no setting."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://user:secret@host/x")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    with pytest.raises(ConfigError) as info:
        Tracker(["mlflow"], output_dir=tmp_path, total_steps=1)
    message = str(info.value)
    assert message.startswith(
        "trainer.loggers: logger 'mlflow' could not start with "
        "MLFLOW_TRACKING_URI='bogus://***@host/x': UnsupportedModelRegistryStoreURIException: "
        "Model registry functionality is unavailable; got unsupported URI"
    )
    assert "\n" not in message and "secret" not in message


def test_a_tracker_that_fails_to_start_marks_the_runs_it_started_failed(tmp_path, monkeypatch):
    """mlflow started, then the next sink failed to start: the mlflow run read FINISHED
    (``close()`` without ``failed``) for a run that never ran."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")

    def refusing_sink(run):
        raise RuntimeError("no such server")

    monkeypatch.setitem(SINKS._entries, "refusing", refusing_sink)
    with pytest.raises(RuntimeError, match="no such server"):
        Tracker(["mlflow", "refusing"], output_dir=tmp_path, total_steps=1, run_name="never")
    client = MlflowClient(tracking_uri=f"file:{(tmp_path / 'mlruns').resolve()}")
    (run,) = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
    assert (run.info.run_name, run.info.status) == ("never", "FAILED")


def test_the_file_store_is_under_a_run_dir_whose_name_has_uri_characters(tmp_path, monkeypatch):
    """The store's URI was ``"file:" + path``: MLflow read ``#`` as the start of a fragment and
    decoded ``%41`` as ``A``, so the run of ``run#1`` wrote its store to a sibling dir ``run``
    and the run of ``lr%41`` to ``lrA/mlruns``, outside the run dir."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for name in ("run#1", "lr%41", "a b"):
        with Tracker(["mlflow"], output_dir=tmp_path / name, total_steps=1, run_name=name) as t:
            t.log(1, {"generate/reward_mean": 0.5})
        store = tmp_path / name / "mlruns"
        client = MlflowClient(tracking_uri=store.as_uri())
        (run,) = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
        assert run.info.run_name == name
        assert run.info.artifact_uri.startswith(store.as_uri())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b", "lr%41", "run#1"]
