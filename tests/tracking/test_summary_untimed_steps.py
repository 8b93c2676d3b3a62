"""The summary's time split covers only the steps with a step time: a step whose
``timing/step_s`` is NaN (or missing) adds neither its step time nor its phases."""

from __future__ import annotations

import math

from skyrl.tracking import format_summary

OUTSIDE = "outside generate, forward, train, sync and eval"
WITHIN = "within the phases above: all but generation, eval and the workers' compute"


def test_a_step_without_a_step_time_is_left_out_of_the_time_split(tmp_path):
    # before: step 2's phases were added to the totals of steps 1 and 3 alone, so generate
    # read (4 + 6 + 2) / 20 = 60%, train (4 + 6 + 5) / 20 = 75%, overhead 1 - 27 / 20 = -35%
    history = [
        {"step": 1, "timing/step_s": 10.0, "timing/generate_s": 4.0, "timing/train_s": 4.0},
        {"step": 2, "timing/step_s": math.nan, "timing/generate_s": 6.0, "timing/train_s": 6.0},
        {"step": 3, "timing/step_s": 10.0, "timing/generate_s": 2.0, "timing/train_s": 5.0},
    ]
    # steps 1 and 3: 20 s; generate (4 + 2) / 20 = 30%, mean 3.00 s; train (4 + 5) / 20 =
    # 45%, mean 4.50 s; overhead 1 - (6 + 9) / 20 = 25%
    assert format_summary(history, tmp_path / "missing").splitlines() == [
        "steps run: 3",
        "time per step: 10.00s mean, 20.0s total",
        "  generate: 3.00s mean, 30% of step time",
        "  train: 4.50s mean, 45% of step time",
        "framework overhead: 25% of step time (" + OUTSIDE + ")",
    ]


def test_a_step_without_step_time_key_is_left_out_with_the_logged_overhead(tmp_path):
    history = [
        {"step": 1, "timing/step_s": 8.0, "timing/generate_s": 6.0, "timing/overhead_frac": 0.25},
        {"step": 2, "timing/generate_s": 9.0, "timing/overhead_frac": 0.5},  # no step time
    ]
    # step 1 alone: generate 6 / 8 = 75% (before: (6 + 9) / 8 = 188%), overhead 25%
    assert format_summary(history, tmp_path / "missing").splitlines() == [
        "steps run: 2",
        "time per step: 8.00s mean, 8.0s total",
        "  generate: 6.00s mean, 75% of step time",
        "framework overhead: 25% of step time (" + WITHIN + ")",
    ]
