"""JSON-lines sink: ``<output_dir>/metrics.jsonl``, one ``{"step": N, ...}`` record per step.

Always on. Each line is flushed as soon as it is written, so a killed run keeps every finished
step. JSON has no NaN: non-finite values are written as ``null`` (``read_records`` keeps them
as ``None``; ``skyrl.tracking.summary.read_history`` turns them back into NaN).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl.tracking.sink import RunInfo, move_aside

if TYPE_CHECKING:
    from skyrl.config.errors import ConfigError

FILENAME = "metrics.jsonl"


class JsonlSink:
    """Appends one record per step; a resumed run drops the records after the resumed step
    when it writes its first one, so a resume that fails before that (another sink that would
    not start, a crash before the first step ends) leaves the file as it was: a resume from
    an earlier checkpoint than ``latest`` that failed does not lose the later steps' records
    that a resume from ``latest`` still needs; a resume that ends without a failure having
    logged none (at or past ``total_steps``: nothing to train, the checkpoint exported again)
    drops them as it closes, its history ends at the resumed step. A fresh run finding a file
    (an earlier run killed before its first checkpoint) moves it aside to ``metrics.jsonl.N``
    and starts its own; so does a run resumed from another run dir's checkpoint (``RunInfo.history_here``):
    the records here are not that checkpoint's steps. A run that fails before writing a record
    to the file it created (a tracker that did not start) removes that empty file, so the next
    try has no empty file to move aside."""

    def __init__(self, run: RunInfo) -> None:
        self.path = run.output_dir / FILENAME
        self.drop_after: int | None = None
        """The resumed step whose later records go before the first ``log`` writes."""
        if self.path.exists():
            if run.start_step > 0 and run.history_here:
                read_records(self.path)  # a damaged line is refused now, before any step
                self.drop_after = run.start_step
            else:
                move_aside(self.path)
        self.created = not self.path.exists()
        """This sink made the file (it holds only what ``log`` wrote)."""
        self.logged = False
        self.file = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write and flush the step's record (a resumed run's first drops the later ones)."""
        if self.drop_after is not None:
            self.file.close()  # the drop replaces the file: append to the new one
            self._drop_later_records()
            self.file = open(self.path, "a", encoding="utf-8")
        record = {"step": step, **{k: v if math.isfinite(v) else None for k, v in metrics.items()}}
        self.logged = True  # before writing: a write that fails half-way leaves the file be
        self.file.write(json.dumps(record, allow_nan=False) + "\n")
        self.file.flush()

    def _drop_later_records(self) -> None:
        assert self.drop_after is not None
        drop_records_after(self.path, self.drop_after)
        self.drop_after = None

    def close(self, failed: bool = False) -> None:
        """Close the file; after a failure, remove it if it is this sink's and still empty. A
        resumed run that ends without a failure having logged no step drops the later records."""
        self.file.close()
        if failed and self.created and not self.logged:
            self.path.unlink(missing_ok=True)
        elif not failed and self.drop_after is not None:
            self._drop_later_records()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics file; a torn last line (killed mid-write) is ignored. Any
    other line that is not a record (``{"step": N, ...}``) is refused: a ``ConfigError``
    naming the file and line, raised before anything rewrites the file."""
    lines = path.read_bytes().splitlines()  # bytes: a line that is not UTF-8 is one bad line
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            if number == len(lines):
                break
            record = None
        if not (isinstance(record, dict) and isinstance(record.get("step"), int)):
            raise damaged_line_error(path, number, line)
        records.append(record)
    return records


def damaged_line_error(path: Path, number: int, line: bytes) -> ConfigError:
    """The one-line error for line ``number`` of ``path``, which is not a metrics record: a
    ``ConfigError`` on ``trainer.output_dir``, so ``skyrl-train`` ends in that line."""
    from skyrl.config.errors import ConfigError  # imports hydra: only on failure

    shown = line[:80].decode("utf-8", errors="replace")
    return ConfigError(
        "trainer.output_dir",
        f"{path}:{number} is not a metrics record: {shown!r}; fix or delete that line, then "
        "run again (the file was left as it was)",
    )


def drop_records_after(path: Path, last_step: int) -> None:
    """Keep only records with ``step <= last_step``, replacing the file atomically."""
    kept = [r for r in read_records(path) if r["step"] <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in kept), encoding="utf-8")
    os.replace(tmp, path)
