"""TensorBoard sink: scalars under ``<output_dir>/tensorboard`` via torch's ``SummaryWriter``.

On resume the writer purges events after the resumed step, matching ``metrics.jsonl``.
"""

from __future__ import annotations

import json

from skyrl.tracking.sink import RunInfo, require


class TensorBoardSink:
    """One scalar per metric per step; the config as a text summary."""

    def __init__(self, run: RunInfo) -> None:
        require("tensorboard", "tensorboard", logger="tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            log_dir=str(run.output_dir / "tensorboard"),
            purge_step=run.start_step + 1 if run.start_step > 0 else None,
        )
        config_json = json.dumps(run.config, indent=2, default=str)
        self.writer.add_text("config", f"```\n{config_json}\n```", global_step=run.start_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Add the step's scalars."""
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
