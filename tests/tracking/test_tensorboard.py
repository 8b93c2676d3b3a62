"""TensorBoard sink: an event file TensorBoard's own reader understands, purged on resume."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from skyrl.tracking import Tracker


def scalars(tb_dir, tag: str) -> list[tuple[int, float]]:
    accumulator = EventAccumulator(str(tb_dir))
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def test_scalars_are_readable_and_resume_replaces_later_steps(tmp_path):
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=3, config={"a": 1}) as tracker:
        for step in (1, 2, 3):
            tracker.log(step, {"eval/pass@1": step / 10, "generate/reward_mean": float(step)})
    assert scalars(tmp_path / "tensorboard", "eval/pass@1") == [
        (1, pytest.approx(0.1)),
        (2, pytest.approx(0.2)),
        (3, pytest.approx(0.3)),
    ]
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=3, start_step=1) as tracker:
        tracker.log(2, {"generate/reward_mean": 20.0})
    assert scalars(tmp_path / "tensorboard", "generate/reward_mean") == [(1, 1.0), (2, 20.0)]


def test_a_fresh_run_over_an_unfinished_one_shows_only_its_own_steps(tmp_path):
    """An earlier run killed before its first checkpoint leaves its events; a fresh run in the
    same dir moves them aside (as ``metrics.jsonl`` is), so TensorBoard does not mix the two."""
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=10) as tracker:
        for step in (1, 2, 3):
            tracker.log(step, {"generate/reward_mean": 0.9})
    with Tracker(["tensorboard"], output_dir=tmp_path, total_steps=10) as tracker:
        for step in (1, 2):
            tracker.log(step, {"generate/reward_mean": 0.1})
    assert scalars(tmp_path / "tensorboard", "generate/reward_mean") == [
        (1, pytest.approx(0.1)),
        (2, pytest.approx(0.1)),
    ]
    assert scalars(tmp_path / "tensorboard.1", "generate/reward_mean") == [
        (1, pytest.approx(0.9)),
        (2, pytest.approx(0.9)),
        (3, pytest.approx(0.9)),
    ]
