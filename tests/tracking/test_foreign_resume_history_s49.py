"""A run resumed from another run dir's checkpoint (``trainer.resume=<a>/checkpoints/global_step_2``
with ``trainer.output_dir=<b>``) into a dir where an earlier run left records: those records
are not the checkpoint's steps 1..2. They were kept and continued, so ``metrics.jsonl``, the
summary and TensorBoard showed run b's steps 1-2 followed by run a's 3-4 as one run."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from skyrl.tracking import Tracker
from skyrl.tracking.summary import format_summary, read_history
from skyrl.trainer.checkpoint import CheckpointManager


def _earlier_run_killed_at_step_3(run_dir) -> None:
    # a fresh run killed before its first checkpoint (trainer.ckpt_interval=0): records only
    with Tracker(["tensorboard"], output_dir=run_dir, total_steps=10) as tracker:
        for step in (1, 2, 3):
            tracker.log(step, {"generate/reward_mean": 0.9})


def _steps(path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["step"], r["generate/reward_mean"]) for r in records]


def test_a_resume_from_another_runs_checkpoint_moves_the_earlier_records_aside(tmp_path):
    _earlier_run_killed_at_step_3(tmp_path)
    with Tracker(
        ["tensorboard"], output_dir=tmp_path, total_steps=4, start_step=2, history_here=False
    ) as tracker:
        for step in (3, 4):
            tracker.log(step, {"generate/reward_mean": 0.1})
    assert _steps(tmp_path / "metrics.jsonl") == [(3, 0.1), (4, 0.1)]
    assert _steps(tmp_path / "metrics.jsonl.1") == [(1, 0.9), (2, 0.9), (3, 0.9)]
    # the summary compares this run's steps only: 0.100 -> 0.100, not 0.900 -> 0.100
    summary = format_summary(read_history(tmp_path), tmp_path)
    assert "steps run: 2\ntraining reward: first step 0.100 -> last step 0.100" in summary
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    shown = [(e.step, e.value) for e in accumulator.Scalars("generate/reward_mean")]
    assert shown == [(3, pytest.approx(0.1)), (4, pytest.approx(0.1))]
    assert (tmp_path / "tensorboard.1").is_dir()


def test_a_resume_from_this_runs_own_checkpoint_still_continues_its_records(tmp_path):
    _earlier_run_killed_at_step_3(tmp_path)
    with Tracker(["jsonl"], output_dir=tmp_path, total_steps=4, start_step=2) as tracker:
        tracker.log(3, {"generate/reward_mean": 0.1})
    assert _steps(tmp_path / "metrics.jsonl") == [(1, 0.9), (2, 0.9), (3, 0.1)]
    assert not (tmp_path / "metrics.jsonl.1").exists()


def test_the_trainer_tells_its_own_checkpoints_from_another_runs(tmp_path):
    own = CheckpointManager(tmp_path / "b" / "checkpoints", max_to_keep=2)
    (own.root / "global_step_2").mkdir(parents=True)
    (tmp_path / "a" / "checkpoints" / "global_step_2").mkdir(parents=True)
    assert own.holds(own.root / "global_step_2")
    assert own.holds(tmp_path / "b" / "checkpoints" / ".." / "checkpoints" / "global_step_2")
    assert not own.holds(tmp_path / "a" / "checkpoints" / "global_step_2")
