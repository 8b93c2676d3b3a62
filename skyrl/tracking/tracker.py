"""``Tracker``: fans each training step's metrics out to the chosen sinks.

``jsonl`` is always on: ``metrics.jsonl`` is the run's record that resume, the plot and the
end-of-run summary read, whatever else the user picked.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from skyrl.registry import Registry
from skyrl.tracking.console import ConsoleSink
from skyrl.tracking.jsonl import JsonlSink
from skyrl.tracking.mlflow import MlflowSink
from skyrl.tracking.sink import RunInfo, Sink
from skyrl.tracking.tensorboard import TensorBoardSink
from skyrl.tracking.wandb import WandbSink

SINKS: Registry[Callable[[RunInfo], Sink]] = Registry("logger")
"""Logger name (``trainer.loggers``) -> sink factory ``RunInfo -> Sink``; the optional packages
are imported only by the chosen sinks. A recipe adds its own sink by registering a factory::

    from skyrl.tracking import SINKS

    @SINKS.register("my_sink")
    class MySink:  # skyrl.tracking.sink.Sink: log(step, metrics) and close(failed=False)
        def __init__(self, run: RunInfo): ...

and selects it with ``trainer.loggers=[console,my_sink] imports=[my.module]``."""
SINKS.register("jsonl")(JsonlSink)
SINKS.register("console")(ConsoleSink)
SINKS.register("tensorboard")(TensorBoardSink)
SINKS.register("wandb")(WandbSink)
SINKS.register("mlflow")(MlflowSink)


class Tracker:
    """Logs every step to each chosen sink; ``close`` (or leaving a ``with`` block) finishes them.

    Example::

        with Tracker(["console", "wandb"], output_dir=out, config=cfg, total_steps=20) as t:
            for step in range(1, 21):
                t.log(step, {"generate/reward_mean": 0.3, "timing/step_s": 12.0})
    """

    def __init__(
        self,
        loggers: Sequence[str],
        *,
        output_dir: Path | str,
        total_steps: int,
        config: Mapping[str, Any] | None = None,
        run_name: str | None = None,
        start_step: int = 0,
        history_here: bool = True,
    ) -> None:
        """``start_step``: steps done before (a resume); ``history_here``: their records are in
        ``output_dir`` (``RunInfo.history_here``; False for a resume from another run's
        checkpoint)."""
        if isinstance(loggers, str):
            raise TypeError(
                f"loggers must be a list of logger names, got the string {loggers!r} "
                f"(for one logger: [{loggers!r}])"
            )
        for name in loggers:
            if name not in SINKS:
                raise ValueError(SINKS.unknown(name))
        output_dir = Path(output_dir)
        _require_no_file_at(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        run = RunInfo(
            output_dir=output_dir,
            run_name=run_name or output_dir.name,
            total_steps=total_steps,
            start_step=start_step,
            history_here=history_here,
            config=dict(config or {}),
        )
        self.sinks: list[Sink] = []
        self.closed = False
        try:
            for name in dict.fromkeys(["jsonl", *loggers]):
                self.sinks.append(SINKS.get(name)(run))
        except BaseException:
            self.close(failed=True)  # a run that never started: mlflow marks it FAILED
            raise

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Send one step's metrics (numbers, converted to float) to every sink. A step that is
        not an integer, or a value that is not a number, is refused (``TypeError`` naming it)
        before any sink records the step."""
        if self.closed:
            raise RuntimeError("Tracker.log after close()")
        try:
            step = operator.index(step)  # numpy integers too; json would refuse np.int64
        except TypeError:
            raise TypeError(f"step must be an integer, got {step!r}") from None
        values = {name: _as_float(name, value, step) for name, value in metrics.items()}
        for sink in self.sinks:
            sink.log(step, values)

    def close(self, failed: bool = False) -> None:
        """Flush and finish every sink once; later calls do nothing. ``failed``: the run ended
        with an error (mlflow marks it FAILED, wandb finishes with exit code 1). Closes all
        sinks even if one fails, then raises the first failure."""
        if self.closed:
            return
        self.closed = True
        errors = []
        for sink in self.sinks:
            try:
                _close(sink, failed)
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)


def _require_no_file_at(output_dir: Path) -> None:
    """Refuse an ``output_dir`` that is a file or lies under one (``mkdir`` said only "File
    exists" or "Not a directory", naming the run dir rather than the file in the way)."""
    file = next((p for p in (output_dir, *output_dir.parents) if p.is_file()), None)
    if file == output_dir:
        raise NotADirectoryError(f"output_dir {output_dir} is a file, not a directory")
    if file is not None:
        raise NotADirectoryError(f"output_dir {output_dir} is under a file: {file}")


def _as_float(name: str, value: Any, step: int) -> float:
    """``float(value)``, or a ``TypeError`` naming the metric and the step."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"metric {name!r} at step {step} is not a number: {value!r}") from None


def _close(sink: Sink, failed: bool) -> None:
    """``sink.close(failed=True)`` for a failed run if its ``close`` takes ``failed``; else
    ``sink.close()`` (a recipe sink written before ``failed`` existed keeps working)."""
    if failed and "failed" in inspect.signature(sink.close).parameters:
        sink.close(failed=True)
    else:
        sink.close()
