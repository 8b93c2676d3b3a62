"""What every metric sink shares: the run it logs for, its two-method protocol, the check
that an optional package is installed, the error for a backend that will not start, and how a
fresh run moves an earlier run's files aside."""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from skyrl.config.errors import ConfigError


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
    history_here: bool = True
    """A resumed run's records of steps 1..``start_step`` are in ``output_dir`` (it resumed from
    a checkpoint of this run dir). False: from another run's checkpoint, whose records are in
    that run's dir; the files found here (``metrics.jsonl``, ``tensorboard``) are an earlier
    run's, moved aside as a fresh run moves them, not continued."""
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved run config (nested dicts), recorded by wandb, mlflow and tensorboard."""


class Sink(Protocol):
    """A metric destination: one ``log`` per training step, one ``close`` at the end."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics (values are already Python floats)."""

    def close(self, failed: bool = False) -> None:
        """Flush and finish; called exactly once. ``failed``: the run ended with an error (a
        sink that records a run's status marks it failed; the others ignore it). A sink whose
        ``close`` takes no ``failed`` (written before it existed) is called as ``close()``."""


def move_aside(path: Path) -> Path:
    """Rename ``path`` (a file or folder an earlier run left: one killed before its first
    checkpoint, so nothing resumes it) to the first free ``<name>.N`` (``metrics.jsonl.1``,
    ``.2``, ...), so a fresh run starts its own; returns the new path."""
    n = 1
    while path.with_name(f"{path.name}.{n}").exists():
        n += 1
    aside = path.with_name(f"{path.name}.{n}")
    os.replace(path, aside)
    return aside


def require(module: str, pip_name: str, logger: str) -> ModuleType:
    """Import an optional package, or fail saying which pip package the logger needs."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(install_hint(pip_name, logger)) from error


def install_hint(pip_name: str, logger: str) -> str:
    """The message for a logger whose optional package ``pip_name`` is not installed (also
    the pre-flight check's, which looks before the run starts)."""
    return (
        f"logger '{logger}' needs the '{pip_name}' package: pip install {pip_name} "
        "(or pip install 'skyrl[trackers]' for every tracker)"
    )


def start_error(logger: str, settings: tuple[str, ...], error: Exception) -> ConfigError:
    """The one-line error for a backend that refused to start (a bad ``WANDB_MODE``, an
    ``MLFLOW_TRACKING_URI`` it cannot use, no login): the logger, the ``settings`` (environment
    variables) that are set and the backend's first line, any password in a URI masked.
    A ``ConfigError`` on ``trainer.loggers``, so ``skyrl-train`` ends in that line."""
    from skyrl.config.errors import ConfigError, exception_line  # imports hydra: only on failure

    shown = [
        f"{name}={_mask_password(os.environ[name])!r}" for name in settings if name in os.environ
    ]
    where = f" with {', '.join(shown)}" if shown else ""
    reason = _mask_password(exception_line(error))  # MLflow quotes the URI it refused
    return ConfigError("trainer.loggers", f"logger '{logger}' could not start{where}: {reason}")


def _mask_password(value: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://***@host``."""
    return re.sub(r"//[^/@]*@", "//***@", value)
