"""A resume at or past ``trainer.total_steps`` logs no step: its history ends at the resumed step.

``trainer.resume=<run>/checkpoints/global_step_2 trainer.total_steps=2`` (the way to export
an earlier checkpoint again) points ``latest`` at step 2, moves the step-4 ``final_hf`` aside
and exports step 2; the records of steps 3-4 stayed in ``metrics.jsonl`` and TensorBoard, so
the end-of-run summary read "steps run: 4" with step 4's eval, of weights the run abandoned.
A resume that fails before its first step still drops nothing (``test_tracking_s48.py``).
"""

from __future__ import annotations

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from skyrl.tracking import Tracker
from skyrl.tracking.summary import format_summary, read_history


def test_a_resume_with_nothing_to_train_drops_the_later_records(tmp_path):
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=4) as tracker:
        for step in (1, 2, 3, 4):
            tracker.log(step, {"generate/reward_mean": step / 10, "eval/pass@1": step / 10})
    # resumed from step 2 with trainer.total_steps=2: no step runs, the run ends cleanly
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=2, start_step=2):
        pass
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("generate/reward_mean")] == [1, 2]
    summary = format_summary(read_history(tmp_path), tmp_path)
    assert "steps run: 2" in summary  # was 4
    assert "eval/pass@1: 0.100 (step 1) -> 0.200 (step 2)" in summary  # was 0.400 (step 4)


def test_a_resume_from_the_last_step_with_nothing_to_train_keeps_every_record(tmp_path):
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=4) as tracker:
        for step in (1, 2, 3, 4):
            tracker.log(step, {"generate/reward_mean": step / 10})
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=4, start_step=4):
        pass  # re-exporting latest: nothing after step 4 to drop
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("generate/reward_mean")] == [1, 2, 3, 4]
