"""Console sink: the one-line-per-step format, missing keys, stdout when not a TTY, and a
closed stdout (a pipe whose reader exited)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from skyrl.tracking import Tracker
from skyrl.tracking.console import format_step_line
from skyrl.tracking.jsonl import read_records

FULL_STEP = {
    "generate/reward_mean": 0.3124,
    "eval/pass@1": 0.25,
    "generate/response_length_mean": 41.23,
    "policy/kl": 0.00123,
    "policy/loss": 0.031,
    "policy/grad_norm": 0.84,
    "timing/step_s": 12.3,
    "timing/generate_s": 4.92,  # 4.92 / 12.3 = 40%
    "timing/forward_s": 1.476,  # 12%
    "timing/train_s": 5.535,  # 45%
}


def test_full_line():
    assert format_step_line(3, 20, FULL_STEP) == (
        "step 3/20 | reward 0.312 | eval 0.250 | len 41.2 | kl 0.0012 | loss 0.031 | gnorm 0.84"
        " | 12.3s (gen 40% fwd 12% train 45%)"
    )


def test_missing_keys_are_skipped():
    assert format_step_line(1, 2, {}) == "step 1/2"
    assert format_step_line(1, 2, {"policy/kl": 0.5, "timing/step_s": 2.0}) == (
        "step 1/2 | kl 0.5 | 2.0s"
    )
    # names nothing writes any more are not read: the old summed loss, the KL loss alias
    old_names = {"policy/policy_loss": 1.0, "policy/kl_loss": 1.0}
    assert format_step_line(1, 2, old_names) == "step 1/2"
    # a phase without the step time is not shown; sync/eval shares appear when logged
    assert format_step_line(1, 2, {"timing/generate_s": 1.0}) == "step 1/2"
    assert format_step_line(1, 2, {"timing/step_s": 4.0, "timing/sync_s": 1.0}) == (
        "step 1/2 | 4.0s (sync 25%)"
    )


def test_eval_is_the_mean_of_per_set_pass_at_1_keys():
    # (0.2 + 0.4) / 2 = 0.3; pass@16 is not pass@1
    metrics = {"eval/gsm8k/pass@1": 0.2, "eval/math/pass@1": 0.4, "eval/math/pass@16": 0.9}
    assert format_step_line(4, 4, metrics) == "step 4/4 | eval 0.300"


def test_nan_is_shown_as_nan():
    assert format_step_line(1, 1, {"generate/reward_mean": float("nan")}) == "step 1/1 | reward nan"


def test_lines_go_to_stdout_without_a_bar_when_not_a_tty(tmp_path, capsys):
    with Tracker(["console"], output_dir=tmp_path, total_steps=2, start_step=1) as tracker:
        tracker.log(2, {"generate/reward_mean": 1.0, "timing/step_s": 0.5})
    out, err = capsys.readouterr()
    assert out == "step 2/2 | reward 1.000 | 0.5s\n"
    assert err == ""


class ClosedPipe(io.StringIO):
    """stdout whose reader has gone (``skyrl-train ... | head -5`` after five lines)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_stops_the_lines_not_the_run(tmp_path, monkeypatch, capsys):
    """Was ``BrokenPipeError`` out of ``Tracker.log``, which ended training; now the console
    says so once on stderr, prints nothing more, and metrics.jsonl records every step."""
    with Tracker(["console"], output_dir=tmp_path, total_steps=3) as tracker:
        monkeypatch.setattr(sys, "stdout", ClosedPipe())
        for step in (1, 2, 3):
            tracker.log(step, {"generate/reward_mean": 0.5})
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert capsys.readouterr().err == (
        "console: stdout was closed (its reader exited): no more step lines; "
        "metrics.jsonl still records every step\n"
    )


def test_a_closed_stdout_pipe_ends_the_process_cleanly(tmp_path):
    """The real stdout of a process piped into a reader that exited: the run goes on, later
    prints (the end-of-run summary) do not fail, and no ``Exception ignored ... BrokenPipeError``
    at exit."""
    script = (
        "import sys\n"
        "from skyrl.tracking import Tracker\n"
        "with Tracker(['console'], output_dir=sys.argv[1], total_steps=3) as tracker:\n"
        "    for step in (1, 2, 3):\n"
        "        tracker.log(step, {'generate/reward_mean': 0.5})\n"
        "print('summary', flush=True)\n"
    )
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first line
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (
        0,
        "console: stdout was closed (its reader exited): no more step lines; "
        "metrics.jsonl still records every step\n",
    )
    assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [1, 2, 3]
