"""Two metric names that MLflow's name cleaning maps to one key (data sources ``a/b`` and
``a.b``: ``eval/a/b/pass@1`` and ``eval/a.b/pass@1`` both clean to ``eval/a.b.pass_at_1``)
are logged under two keys, the later one suffixed, each with its own values at every step;
they were written to one key, two values per step, one hiding the other."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from skyrl.tracking import Tracker


def test_names_that_clean_to_one_key_keep_their_own_histories(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with Tracker(["mlflow"], output_dir=tmp_path, total_steps=2, run_name="m") as t:
        t.log(1, {"eval/a/b/pass@1": 0.25, "eval/a.b/pass@1": 0.75})
        t.log(2, {"eval/a.b/pass@1": 0.5, "eval/a/b/pass@1": 1.0})  # other order: same keys

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
    assert set(run.data.metrics) == {"eval/a.b.pass_at_1", "eval/a.b.pass_at_1_2"}

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    assert history("eval/a.b.pass_at_1") == [(1, 0.25), (2, 1.0)]
    assert history("eval/a.b.pass_at_1_2") == [(1, 0.75), (2, 0.5)]
    # said once, naming both metrics and the key each went to
    err = capsys.readouterr().err
    assert err.count("eval/a.b/pass@1") == 1
    assert "'eval/a.b/pass@1' as 'eval/a.b.pass_at_1_2'" in err
    assert "'eval/a/b/pass@1' has 'eval/a.b.pass_at_1'" in err


def test_a_suffixed_key_does_not_take_a_later_metric_s_own_key(tmp_path, monkeypatch):
    # the suffix of a clash is skipped over by, and does not hide, a name that is its own key
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with Tracker(["mlflow"], output_dir=tmp_path, total_steps=1, run_name="m") as t:
        t.log(1, {"x/a_b": 1.0, "x/a#b": 2.0, "x/a_b_2": 3.0})

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("skyrl").experiment_id])
    # x/a#b cleans to x/a_b (taken) -> x/a_b_2; the real x/a_b_2 then gets x/a_b_2_2
    assert run.data.metrics == {"x/a_b": 1.0, "x/a_b_2": 2.0, "x/a_b_2_2": 3.0}
