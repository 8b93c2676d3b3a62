"""Weights & Biases sink.

Runs offline (``<output_dir>/wandb/offline-run-*``, uploadable later with ``wandb sync``)
unless ``WANDB_MODE`` is set, so a run never needs network or a login by default. Each
tracker owns its own wandb run (``reinit="create_new"``); a resumed run starts a new one.
``finish()`` hands the rest to wandb's background service, which completes the offline run
file shortly after (at the latest in wandb's exit hook, or at ``wandb.teardown()``).
"""

from __future__ import annotations

import os

from skyrl.tracking.sink import RunInfo, require, start_error

SETTINGS = ("WANDB_MODE", "WANDB_PROJECT")
"""The environment variables this sink reads, named when wandb will not start."""


class WandbSink:
    """A wandb run named after the skyrl run, with the config recorded."""

    def __init__(self, run: RunInfo) -> None:
        wandb = require("wandb", "wandb", logger="wandb")
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "skyrl"),
                name=run.run_name,
                config=run.config,
                dir=str(run.output_dir),
                mode=None if "WANDB_MODE" in os.environ else "offline",
                reinit="create_new",
            )
        except Exception as error:  # a mode it does not know, no login for online mode, ...
            raise start_error("wandb", SETTINGS, error) from error

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Log the step's metrics at wandb step ``step``."""
        self.run.log(metrics, step=step)

    def close(self, failed: bool = False) -> None:
        """Finish the run (writes the offline run file); exit code 1 if it ended with an error
        (wandb then shows it as failed)."""
        self.run.finish(exit_code=1 if failed else 0)
