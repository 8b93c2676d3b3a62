"""TensorBoard sink: scalars under ``<output_dir>/tensorboard`` via torch's ``SummaryWriter``.

On resume the writer purges events after the resumed step, matching ``metrics.jsonl``. A
fresh run finding a ``tensorboard`` folder (an earlier run killed before its first checkpoint)
moves it aside to ``tensorboard.N``, as the jsonl sink moves ``metrics.jsonl``: a second event
file beside the old one would show both runs' steps as one.
"""

from __future__ import annotations

import json

from skyrl.tracking.sink import RunInfo, move_aside, require


class TensorBoardSink:
    """One scalar per metric per step; the config as a text summary."""

    def __init__(self, run: RunInfo) -> None:
        require("tensorboard", "tensorboard", logger="tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = run.output_dir / "tensorboard"
        if run.start_step == 0 and log_dir.exists():
            move_aside(log_dir)
        self.writer = SummaryWriter(
            log_dir=str(log_dir),
            purge_step=run.start_step + 1 if run.start_step > 0 else None,
        )
        config_json = json.dumps(run.config, indent=2, default=str)
        self.writer.add_text("config", f"```\n{config_json}\n```", global_step=run.start_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Add the step's scalars."""
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def close(self, failed: bool = False) -> None:
        """Flush and close the event file."""
        self.writer.close()
