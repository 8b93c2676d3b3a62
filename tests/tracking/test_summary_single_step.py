"""The summary's training reward line for a run with one rewarded step."""

from __future__ import annotations

from skyrl.tracking import format_summary


def test_a_single_step_is_not_shown_as_a_before_and_after(tmp_path):
    """Was ``training reward: first 1 steps 0.250 -> last 1 steps 0.250``: one value shown as
    a before/after of itself (a run stopped after its first step, ``total_steps=1``)."""
    history = [
        {"step": 0, "eval/pass@1": 0.5},  # eval before training: not a training step
        {"step": 1, "generate/reward_mean": 0.25},
    ]
    assert format_summary(history, tmp_path / "missing").splitlines()[:2] == [
        "steps run: 1",
        "training reward: 0.250 (step 1, the only step)",
    ]


def test_one_rewarded_step_among_others_names_that_step(tmp_path):
    # step 1 logged no reward (a NaN, read back from null): the one value is step 2's
    history = [
        {"step": 1, "generate/reward_mean": float("nan")},
        {"step": 2, "generate/reward_mean": 0.75},
    ]
    assert format_summary(history, tmp_path / "missing").splitlines() == [
        "steps run: 2",
        "training reward: 0.750 (step 2, the only step with a reward)",
    ]
