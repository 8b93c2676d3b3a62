"""End-of-run plot and summary text, checked against hand-computed numbers."""

from __future__ import annotations

from matplotlib.image import imread

from skyrl.tracking import format_summary, plot_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
OUTSIDE = "outside generate, forward, train, sync and eval"
WITHIN = "within the phases above: all but generation, eval and the workers' compute"


def small_history() -> list[dict[str, float]]:
    """Eval before training (step 0) and on steps 3 and 6; six training steps of 10 s."""
    history = [{"step": 0, "eval/pass@1": 0.2, "timing/eval_s": 3.0}]
    for step in range(1, 7):
        record = {
            "step": step,
            "generate/reward_mean": step / 10,
            "generate/response_length_mean": 40.0 + step,
            "timing/step_s": 10.0,
            "timing/generate_s": 4.0,
            "timing/forward_s": 1.0,
            "timing/train_s": 3.0,
            "timing/sync_s": 0.5,
        }
        if step % 3 == 0:
            record.update({"eval/pass@1": 0.3 if step == 3 else 0.5, "timing/eval_s": 1.0})
        history.append(record)
    return history


def test_plot_is_a_png(tmp_path):
    path = plot_history(small_history(), tmp_path / "plots" / "history.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, _ = imread(path).shape
    assert (width, height) == (1300, 360)  # figsize (13, 3.6) at 100 dpi


def test_an_asynchronous_run_gets_a_staleness_panel(tmp_path):
    history = small_history()
    for record in history[1:]:
        record.update({"async/staleness_mean": 0.75, "async/staleness_max": 1.0})
    path = plot_history(history, tmp_path / "async.png")
    height, width, _ = imread(path).shape
    assert (width, height) == (1700, 360)  # a fourth panel: figsize (17, 3.6) at 100 dpi


def test_plot_without_any_series_still_renders(tmp_path):
    path = plot_history([{"step": 1, "policy/loss": 0.1}], tmp_path / "empty.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE


def test_summary_numbers(tmp_path):
    for name in ("metrics.jsonl", "history.png"):
        (tmp_path / name).write_text("")
    (tmp_path / "checkpoints").mkdir()
    text = format_summary(small_history(), tmp_path, extra={"wall time s": 61.234, "model": "m"})
    # 6 steps: windows of 3, first (0.1+0.2+0.3)/3 = 0.2, last (0.4+0.5+0.6)/3 = 0.5
    # step 0 is not a training step: totals are over steps 1-6, 6 x 10 s = 60 s
    #   generate 24/60 = 40%, forward 6/60 = 10%, train 18/60 = 30%, sync 3/60 = 5%,
    #   eval 2/60 = 3.3% (mean 1.00 s over the 2 steps that ran it)
    # overhead = 1 - (24 + 6 + 18 + 3 + 2) / 60 = 7/60 = 11.7%
    assert text == "\n".join(
        [
            "steps run: 6",
            "training reward: first 3 steps 0.200 -> last 3 steps 0.500",
            "eval/pass@1: 0.200 (step 0) -> 0.500 (step 6)",
            "time per step: 10.00s mean, 60.0s total",
            "  generate: 4.00s mean, 40% of step time",
            "  forward: 1.00s mean, 10% of step time",
            "  train: 3.00s mean, 30% of step time",
            "  sync: 0.50s mean, 5% of step time",
            "  eval: 1.00s mean, 3% of step time",
            "framework overhead: 12% of step time (" + OUTSIDE + ")",
            "outputs:",
            f"  metrics: {tmp_path / 'metrics.jsonl'}",
            f"  plot: {tmp_path / 'history.png'}",
            f"  checkpoints: {tmp_path / 'checkpoints'}",
            "wall time s: 61.23",
            "model: m",
        ]
    )


def test_logged_overhead_is_preferred_and_short_runs_compare_what_they_have(tmp_path):
    history = [
        {"step": 1, "generate/reward_mean": 0.0, "timing/step_s": 2.0, "timing/overhead_frac": 0.1},
        {"step": 2, "generate/reward_mean": 1.0, "timing/step_s": 2.0, "timing/overhead_frac": 0.3},
    ]
    text = format_summary(history, tmp_path / "missing")
    # 2 steps: the first (0.0) vs the last (1.0), the windows never overlap (they said 0.5 ->
    # 0.5, both the mean of both steps); overhead (0.1*2 + 0.3*2) / 4 = 20%
    assert text.splitlines() == [
        "steps run: 2",
        "training reward: first step 0.000 -> last step 1.000",
        "time per step: 2.00s mean, 4.0s total",
        "framework overhead: 20% of step time (" + WITHIN + ")",
    ]


def test_logged_overhead_is_weighted_by_step_time(tmp_path):
    # a 10 s step with 9 s overhead (1 s generate), then a 90 s step with 9 s (81 s generate):
    # overhead is a share of the total step time, like the phase lines: (0.9*10 + 0.1*90) /
    # (10 + 90) = 18 / 100 = 18%, not the per-step mean (0.9 + 0.1) / 2 = 50%
    history = [
        {"step": 1, "timing/step_s": 10.0, "timing/generate_s": 1.0, "timing/overhead_frac": 0.9},
        {"step": 2, "timing/step_s": 90.0, "timing/generate_s": 81.0, "timing/overhead_frac": 0.1},
    ]
    assert format_summary(history, tmp_path / "missing").splitlines() == [
        "steps run: 2",
        "time per step: 50.00s mean, 100.0s total",
        "  generate: 41.00s mean, 82% of step time",  # (1 + 81) / 100
        "framework overhead: 18% of step time (" + WITHIN + ")",
    ]


def test_a_single_eval_is_not_shown_as_a_before_and_after(tmp_path):
    # eval ran once (step 2 of 2, no eval before training): one value, not "x -> x"
    history = [
        {"step": 1, "generate/reward_mean": 0.25},
        {"step": 2, "generate/reward_mean": 0.75, "eval/pass@1": 0.5},
    ]
    assert format_summary(history, tmp_path / "missing").splitlines() == [
        "steps run: 2",
        "training reward: first step 0.250 -> last step 0.750",
        "eval/pass@1: 0.500 (step 2, the only eval)",
    ]


def test_logged_overhead_says_it_is_part_of_the_phases(tmp_path):
    # as a real step logs it: the phases cover the whole 10 s step (4 + 2 + 3 + 1 = 10: 100%),
    # and the overhead, 1 - compute / step with compute = generate 4 + worker compute 3 s
    # = 1 - 7 / 10 = 30%, is time inside forward, train and sync, not a further 30%
    record = {"step": 1, "timing/step_s": 10.0, "timing/generate_s": 4.0, "timing/forward_s": 2.0,
              "timing/train_s": 3.0, "timing/sync_s": 1.0, "timing/overhead_frac": 0.3}  # fmt: skip
    assert format_summary([record], tmp_path / "missing").splitlines()[-1] == (
        "framework overhead: 30% of step time (" + WITHIN + ")"
    )


def test_the_reward_windows_of_a_short_run_do_not_overlap(tmp_path):
    # 7 steps, rewards 0.0, 0.1, ..., 0.6: windows of 7 // 2 = 3, the first 3 (0.0 + 0.1 +
    # 0.2) / 3 = 0.1 vs the last 3 (0.4 + 0.5 + 0.6) / 3 = 0.5; step 4 in neither
    history = [{"step": i + 1, "generate/reward_mean": i / 10} for i in range(7)]
    assert format_summary(history, tmp_path / "missing").splitlines()[1] == (
        "training reward: first 3 steps 0.100 -> last 3 steps 0.500"
    )
