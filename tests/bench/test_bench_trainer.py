"""The trainer bench's figures leave the checkpoint and eval seconds out of the step and out of
the framework overhead share."""

from __future__ import annotations

import pytest
from bench_trainer import figures, steady_step


def test_a_step_without_checkpoint_or_eval_is_as_logged():
    row = {"step": 2, "timing/step_s": 8.0, "timing/overhead_frac": 0.25}
    assert steady_step(row) == pytest.approx((8.0, 0.25))


def test_a_checkpoint_leaves_the_step_and_the_overhead():
    # compute = (1 - 0.5) x 10 = 5 s; without the 4 s save the step is 6 s, of which 1 s is
    # overhead: 1 - 5 / 6 = 1/6 (the logged 0.5 counted the save as overhead)
    row = {
        "step": 5,
        "timing/step_s": 10.0,
        "timing/checkpoint_s": 4.0,
        "timing/overhead_frac": 0.5,
    }
    assert steady_step(row) == pytest.approx((6.0, 1 / 6))


def test_eval_leaves_the_step_and_the_compute():
    # the trainer counts eval as compute: compute = (1 - 0.3) x 10 = 7 s, 2 s of it eval, so
    # 5 s without it; the step without the 1 s save and the 2 s eval is 7 s:
    # overhead 1 - 5 / 7 = 2/7
    row = {
        "step": 4,
        "timing/step_s": 10.0,
        "timing/checkpoint_s": 1.0,
        "timing/eval_s": 2.0,
        "timing/overhead_frac": 0.3,
    }
    assert steady_step(row) == pytest.approx((7.0, 2 / 7))


def test_figures_of_a_real_run_leave_out_step_1_and_the_final_save():
    # steps 1-5 of the default job (4 steps after the first; the last one checkpoints 4.24 s)
    history = [
        {"step": 1, "timing/generate_s": 5.06, "timing/step_s": 11.51, "timing/overhead_frac": 0.224},
        {"step": 2, "timing/generate_s": 3.06, "timing/step_s": 7.10, "timing/overhead_frac": 0.128},
        {"step": 3, "timing/generate_s": 3.19, "timing/step_s": 6.83, "timing/overhead_frac": 0.095},
        {"step": 4, "timing/generate_s": 1.84, "timing/step_s": 5.46, "timing/overhead_frac": 0.099},
        {"step": 5, "timing/generate_s": 1.79, "timing/step_s": 9.69, "timing/overhead_frac": 0.498,
         "timing/checkpoint_s": 4.24},
    ]  # fmt: skip
    out = figures(history)
    # step: (7.10 + 6.83 + 5.46 + (9.69 - 4.24)) / 4 = 24.84 / 4 = 6.21 (not 7.27 with the save)
    assert out["step"] == pytest.approx(6.21)
    # step 5 without its save: compute (1 - 0.498) x 9.69 = 4.86438 s of 5.45 s, overhead
    # 1 - 4.86438 / 5.45 = 0.107453; mean (0.128 + 0.095 + 0.099 + 0.107453) / 4 = 0.107363
    # (not 0.205 with the save)
    assert out["overhead"] == pytest.approx(0.107363, abs=1e-6)
    # (3.06 + 3.19 + 1.84 + 1.79) / 4 = 2.47; the save's 4.24 s over 4 steps = 1.06
    assert out["generate"] == pytest.approx(2.47)
    assert out["checkpoint"] == pytest.approx(1.06)
    assert out["eval"] == 0.0


def test_figures_of_a_run_with_only_step_1_is_an_error():
    with pytest.raises(ValueError, match="no steps after the first"):
        figures([{"step": 1, "timing/step_s": 1.0, "timing/overhead_frac": 0.1}])
