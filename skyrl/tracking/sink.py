"""What every metric sink shares: the run it logs for, its two-method protocol, and the check
that an optional package is installed."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol


@dataclass(frozen=True)
class RunInfo:
    """The run a sink logs for; every sink is built from one of these."""

    output_dir: Path
    """Run directory; file-based sinks write under it."""
    run_name: str
    """Display name in wandb / mlflow."""
    total_steps: int
    """Training steps of the whole run (the progress bar's total)."""
    start_step: int = 0
    """Steps already done before this process (0 = fresh run; k = resumed after step k)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved run config (nested dicts), recorded by wandb, mlflow and tensorboard."""


class Sink(Protocol):
    """A metric destination: one ``log`` per training step, one ``close`` at the end."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics (values are already Python floats)."""

    def close(self) -> None:
        """Flush and finish; called exactly once."""


def require(module: str, pip_name: str, logger: str) -> ModuleType:
    """Import an optional package, or fail saying which pip package the logger needs."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"logger '{logger}' needs the '{pip_name}' package: pip install {pip_name} "
            "(or pip install 'skyrl[trackers]' for every tracker)"
        ) from error
