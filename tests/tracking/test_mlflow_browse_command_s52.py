"""The module's browse command opens the store the sink wrote: MLflow 3 refuses a file store
unless ``MLFLOW_ALLOW_FILE_STORE`` is set, which the sink sets for its own process only, so
the documented ``mlflow ui --backend-store-uri <output_dir>/mlruns`` alone failed with
MLflow's 'filesystem tracking backend ... is in maintenance mode'."""

from __future__ import annotations

import re

from mlflow.tracking import MlflowClient

import skyrl.tracking.mlflow as sink_module
from skyrl.tracking import Tracker


def browse_command() -> str:
    doc = sink_module.__doc__ or ""
    (command,) = re.findall(r"browse with ``([^`]+)``", " ".join(doc.split()))
    return command


def test_the_documented_browse_command_opens_the_sink_s_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with Tracker(["mlflow"], output_dir=tmp_path, total_steps=1, run_name="m") as t:
        t.log(1, {"generate/reward_mean": 0.5})

    # a fresh shell: only what the command itself sets (`A=b mlflow ui ...`)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    words = browse_command().split()
    for word in words[: words.index("mlflow")]:
        name, value = word.split("=", 1)
        monkeypatch.setenv(name, value)
    assert words[words.index("mlflow") :][:3] == ["mlflow", "ui", "--backend-store-uri"]
    store = words[words.index("--backend-store-uri") + 1].replace("<output_dir>", str(tmp_path))
    # mlflow ui opens its backend store through the same registry as a client
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
    assert run.data.metrics == {"generate/reward_mean": 0.5}
