"""MLflow sink: params from the flattened config, metrics per step.

Without ``MLFLOW_TRACKING_URI`` it writes a local file store under ``<output_dir>/mlruns``.
MLflow 3 keeps that store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE``
is set, so this sink sets it (if unset) for that default only, in its own process; a
database store would need SQLAlchemy, which ``mlflow-skinny`` does not install. Anything
else that opens the store needs the setting too: browse with
``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri <output_dir>/mlruns`` (the UI is
in the full ``mlflow`` package, not in ``mlflow-skinny``). The experiment is
``MLFLOW_EXPERIMENT_NAME`` or ``skyrl``.

MLflow refuses names outside ``[A-Za-z0-9_-. /]`` (and ``:`` except on Windows), so for this
sink only ``eval/pass@1`` becomes ``eval/pass_at_1`` and other characters become ``_``. The
file store keeps each metric as a file at its name's path, so ``rollout/logprob_abs_diff``
(a file) and ``rollout/logprob_abs_diff/staleness_1`` (which needs it as a folder) could not
both be logged: a name keeps its first ``/`` (its section, by which MLflow's charts group) and
joins its deeper levels with ``.`` (``rollout/logprob_abs_diff.staleness_1``), on every store.
Two names that clean to one key (data sources ``a/b`` and ``a.b``: ``eval/a/b/pass@1`` and
``eval/a.b/pass@1``) would share one history: the later-seen one gets the key with ``_2``
(``_3``, ...) appended, kept for the rest of the run, and the sink says so once on stderr.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from skyrl.tracking.sink import RunInfo, require, start_error

MAX_PARAM_VALUE_CHARS = 6000
"""MLflow's ``MAX_PARAM_VAL_LENGTH``: longer param values are refused, so they are cut."""
MAX_KEY_CHARS = 250
"""MLflow's ``MAX_ENTITY_KEY_LENGTH`` for param and metric names."""
PARAMS_PER_BATCH = 100
"""MLflow's ``MAX_PARAMS_TAGS_PER_BATCH``."""
METRICS_PER_BATCH = 1000
"""MLflow's ``MAX_METRICS_PER_BATCH``."""
SETTINGS = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")
"""The environment variables this sink reads, named when MLflow will not start."""


class MlflowSink:
    """One MLflow run per tracker; the config as params, every metric with its step."""

    def __init__(self, run: RunInfo) -> None:
        require("mlflow", "mlflow", logger="mlflow")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # as_uri: percent-encoded; "file:" + path put a run dir named ``run#1``'s store
            # in ``run`` (``#`` starts a fragment) and ``lr%41``'s in ``lrA``
            uri = (run.output_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            self.client = MlflowClient(tracking_uri=uri)
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "skyrl")
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(name)
            )
            self.run_id = self.client.create_run(experiment_id, run_name=run.run_name).info.run_id
        except Exception as error:  # the store the settings name refused, or is unreachable
            raise start_error("mlflow", SETTINGS, error) from error
        self.keys: dict[str, str] = {}
        """Metric name -> its MLflow key (``metric_key``)."""
        try:
            self._log_params(run)
        except Exception as error:
            self.close(failed=True)
            raise start_error("mlflow", SETTINGS, error) from error

    def _log_params(self, run: RunInfo) -> None:
        """The flattened config as params, values cut to what MLflow accepts."""
        from mlflow.entities import Param

        params = [
            Param(sanitize_name(key), str(value)[:MAX_PARAM_VALUE_CHARS])
            for key, value in flatten(run.config)
        ]
        for start in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + PARAMS_PER_BATCH])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Log the step's metrics (sanitized names) in as few batches as MLflow allows."""
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        batch = [Metric(self.metric_key(k), v, now_ms, step) for k, v in metrics.items()]
        for start in range(0, len(batch), METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[start : start + METRICS_PER_BATCH])

    def metric_key(self, name: str) -> str:
        """``name``'s key in this run: ``sanitize_name(name)``, or, when another metric already
        has that key, the first free ``<key>_N`` (N = 2, 3, ...), said once on stderr."""
        if name in self.keys:
            return self.keys[name]
        key = clean = sanitize_name(name)
        taken = {k: n for n, k in self.keys.items()}
        n = 1
        while key in taken:
            n += 1
            key = f"{clean[: MAX_KEY_CHARS - len(f'_{n}')]}_{n}"
        if n > 1:
            print(
                f"mlflow: logging {name!r} as {key!r}: {taken[clean]!r} has {clean!r}",
                file=sys.stderr,
            )
        self.keys[name] = key
        return key

    def close(self, failed: bool = False) -> None:
        """Mark the run FINISHED, or FAILED if it ended with an error."""
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def sanitize_name(name: str) -> str:
    """A name MLflow accepts on every OS and store: ``@`` -> ``_at_``, other refused characters
    -> ``_``, empty and dot path segments dropped, the segments after the first joined with
    ``.`` (no name is a folder of another in the file store), at most ``MAX_KEY_CHARS`` long."""
    name = re.sub(r"[^/\w.\- ]", "_", name.replace("@", "_at_"))
    parts = [part for part in name.split("/") if part not in ("", ".", "..")]
    section, *deeper = parts or [""]
    name = f"{section}/{'.'.join(deeper)}" if deeper else section
    return name[:MAX_KEY_CHARS]


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` -> ``("a.b", 1)``; non-mapping values (lists too) are leaves."""
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
