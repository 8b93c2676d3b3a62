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
from typing import Any

from skyrl.tracking.sink import RunInfo, move_aside

FILENAME = "metrics.jsonl"


class JsonlSink:
    """Appends one record per step; on resume first drops records after the resumed step. A
    fresh run finding a file (an earlier run killed before its first checkpoint) moves it
    aside to ``metrics.jsonl.N`` and starts its own."""

    def __init__(self, run: RunInfo) -> None:
        self.path = run.output_dir / FILENAME
        if self.path.exists():
            if run.start_step > 0:
                drop_records_after(self.path, run.start_step)
            else:
                move_aside(self.path)
        self.file = open(self.path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write and flush the step's record."""
        record = {"step": step, **{k: v if math.isfinite(v) else None for k, v in metrics.items()}}
        self.file.write(json.dumps(record, allow_nan=False) + "\n")
        self.file.flush()

    def close(self, failed: bool = False) -> None:
        """Close the file."""
        self.file.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics file; a torn last line (killed mid-write) is ignored."""
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path}:{number} is not a JSON record: {line[:80]!r}") from None
    return records


def drop_records_after(path: Path, last_step: int) -> None:
    """Keep only records with ``step <= last_step``, replacing the file atomically."""
    kept = [r for r in read_records(path) if r["step"] <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in kept), encoding="utf-8")
    os.replace(tmp, path)
