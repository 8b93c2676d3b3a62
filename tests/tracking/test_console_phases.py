"""The console line's timing part: every timed phase of the step, the checkpoint included."""

from __future__ import annotations

from skyrl.tracking.console import format_step_line


def test_a_checkpoint_step_shows_the_checkpoint_share_in_loop_order():
    """Was ``10.0s (gen 40% fwd 10% train 20% eval 10%)``: the 20% spent saving the checkpoint
    (``timing/checkpoint_s``, a phase the loop times between sync and eval) was left out, so
    the shown shares added up to 80% of the step."""
    metrics = {
        "timing/step_s": 10.0,
        "timing/generate_s": 4.0,  # 4 / 10 = 40%
        "timing/forward_s": 1.0,  # 10%
        "timing/train_s": 2.0,  # 20%
        "timing/checkpoint_s": 2.0,  # 20%
        "timing/eval_s": 1.0,  # 10%; 40 + 10 + 20 + 20 + 10 = 100%
    }
    assert format_step_line(5, 5, metrics) == (
        "step 5/5 | 10.0s (gen 40% fwd 10% train 20% ckpt 20% eval 10%)"
    )


def test_sync_comes_before_the_checkpoint():
    metrics = {"timing/step_s": 8.0, "timing/checkpoint_s": 2.0, "timing/sync_s": 1.0}
    # sync 1 / 8 = 12.5% -> "12%" (round half to even), checkpoint 2 / 8 = 25%
    assert format_step_line(2, 4, metrics) == "step 2/4 | 8.0s (sync 12% ckpt 25%)"
