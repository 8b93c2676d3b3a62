"""TensorBoard sink: scalars under ``<output_dir>/tensorboard`` via torch's ``SummaryWriter``.

On resume the writer purges events after the resumed step, matching ``metrics.jsonl``. The
writer (and so its purge marker, which hides the later steps as soon as it is written) starts
at the first ``log``: a resume that failed before its first step (one from an earlier
checkpoint than ``latest``, say) hides nothing that a resume from ``latest`` keeps; a resume
that ends without a failure having logged no step (at or past ``total_steps``: nothing to
train) starts it as it closes, its history ends at the resumed step. A fresh run finding a
``tensorboard`` folder (an earlier run killed before its first checkpoint)
moves it aside to ``tensorboard.N``, as the jsonl sink moves ``metrics.jsonl``: a second event
file beside the old one would show both runs' steps as one. So does a run resumed from another
run dir's checkpoint (``RunInfo.history_here``): the events here are not that checkpoint's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from skyrl.tracking.sink import RunInfo, move_aside, require

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoardSink:
    """One scalar per metric per step; the config as a text summary."""

    def __init__(self, run: RunInfo) -> None:
        require("tensorboard", "tensorboard", logger="tensorboard")
        from torch.utils.tensorboard import SummaryWriter  # one that fails, fails the start

        self.writer_class = SummaryWriter
        self.run = run
        self.log_dir = run.output_dir / "tensorboard"
        if (run.start_step == 0 or not run.history_here) and self.log_dir.exists():
            move_aside(self.log_dir)
        self.log_dir.mkdir(exist_ok=True)  # a folder it cannot make fails the start, not a step
        self.writer: SummaryWriter | None = None
        """torch's ``SummaryWriter``, from the first ``log`` on."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Add the step's scalars (the first step starts the writer)."""
        if self.writer is None:
            self.writer = self._start()
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def _start(self) -> SummaryWriter:
        """The writer, purging the steps after a resumed one, with the config as text."""
        start_step = self.run.start_step
        writer = self.writer_class(
            log_dir=str(self.log_dir), purge_step=start_step + 1 if start_step > 0 else None
        )
        config_json = json.dumps(self.run.config, indent=2, default=str)
        writer.add_text("config", f"```\n{config_json}\n```", global_step=start_step)
        return writer

    def close(self, failed: bool = False) -> None:
        """Flush and close the event file, if a step started one; a resumed run that ends
        without a failure having logged no step starts it first (its purge marker)."""
        if self.writer is None and not failed and self.run.start_step > 0:
            self.writer = self._start()
        if self.writer is not None:
            self.writer.close()
