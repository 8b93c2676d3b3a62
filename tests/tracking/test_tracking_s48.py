"""A resume that fails before its first step leaves the earlier run's record as it was.

Resuming from an earlier checkpoint than ``latest`` rewinds: the later steps' records go. A
resume that never ran a step (another logger would not start, a crash before the step ended)
used to have dropped them already, in ``metrics.jsonl`` and in TensorBoard's view, so a
resume from ``latest`` after it had steps 1-5 then 11: steps 6-10 were lost for good.
"""

from __future__ import annotations

import json
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from skyrl.tracking import Tracker


def steps_in_file(run_dir) -> list[int]:
    text = (run_dir / "metrics.jsonl").read_text()
    return [json.loads(line)["step"] for line in text.splitlines()]


def steps_in_tensorboard(run_dir) -> list[int]:
    accumulator = EventAccumulator(str(run_dir / "tensorboard"))
    accumulator.Reload()
    return [event.step for event in accumulator.Scalars("generate/reward_mean")]


def run_ten_steps(run_dir) -> None:
    with Tracker(["tensorboard"], output_dir=run_dir, total_steps=12) as tracker:
        for step in range(1, 11):
            tracker.log(step, {"generate/reward_mean": float(step)})


def test_a_resume_whose_logger_does_not_start_drops_no_record(tmp_path, monkeypatch):
    run_ten_steps(tmp_path)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "mlflow", None)  # mlflow will not start
        with pytest.raises(ImportError, match="logger 'mlflow' needs the 'mlflow' package"):
            Tracker(["tensorboard", "mlflow"], output_dir=tmp_path, total_steps=12, start_step=5)
    assert steps_in_file(tmp_path) == list(range(1, 11))
    # the resume from latest (step 10) that follows keeps every step and adds its own
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=12, start_step=10) as tracker:
        tracker.log(11, {"generate/reward_mean": 11.0})
    assert steps_in_file(tmp_path) == list(range(1, 12))  # was 1-5, 11
    assert steps_in_tensorboard(tmp_path) == list(range(1, 12))  # was 1-5, 11


def test_a_resume_that_crashes_before_its_first_step_drops_no_record(tmp_path):
    run_ten_steps(tmp_path)
    with pytest.raises(RuntimeError, match="engine died"):
        with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=12, start_step=5):
            raise RuntimeError("engine died")  # the weight sync before step 6, say
    assert steps_in_file(tmp_path) == list(range(1, 11))
    assert steps_in_tensorboard(tmp_path) == list(range(1, 11))


def test_a_resume_that_runs_a_step_still_replaces_the_later_records(tmp_path):
    run_ten_steps(tmp_path)
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=12, start_step=5) as tracker:
        tracker.log(6, {"generate/reward_mean": 60.0})
        tracker.log(7, {"generate/reward_mean": 70.0})
    assert steps_in_file(tmp_path) == [1, 2, 3, 4, 5, 6, 7]
    assert steps_in_tensorboard(tmp_path) == [1, 2, 3, 4, 5, 6, 7]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["generate/reward_mean"] for r in records[5:]] == [60.0, 70.0]


def test_mlflow_logs_a_metric_and_its_breakdown_under_it(tmp_path, monkeypatch):
    """An asynchronous run logs ``rollout/logprob_abs_diff`` and, with rows of several
    staleness values, ``rollout/logprob_abs_diff/staleness_<s>``. MLflow's file store keeps a
    metric as a file at its name's path: the first is a file where the others need a folder,
    so the step raised ``MlflowException: [Errno 20] Not a directory`` and the run died."""
    from mlflow.tracking import MlflowClient

    from skyrl.tracking import metric_names as names

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    step_metrics = {
        names.LOGPROB_ABS_DIFF: 0.25,
        f"{names.LOGPROB_DIFF_BY_STALENESS}0": 0.125,
        f"{names.LOGPROB_DIFF_BY_STALENESS}1": 0.5,
    }
    with Tracker(["mlflow"], output_dir=tmp_path, total_steps=1) as tracker:
        tracker.log(1, step_metrics)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
    assert run.info.status == "FINISHED"
    # the section (MLflow's charts group by it) keeps its "/", deeper levels join with "."
    assert run.data.metrics == {
        "rollout/logprob_abs_diff": 0.25,
        "rollout/logprob_abs_diff.staleness_0": 0.125,
        "rollout/logprob_abs_diff.staleness_1": 0.5,
    }
