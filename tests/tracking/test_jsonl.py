"""metrics.jsonl: one flushed record per step, null for non-finite values, resume truncation."""

from __future__ import annotations

import json
import math

import pytest

from skyrl.tracking import Tracker, read_history
from skyrl.tracking.jsonl import read_records


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_is_always_on_and_flushed_per_step(tmp_path):
    tracker = Tracker([], output_dir=tmp_path, total_steps=3)
    tracker.log(1, {"generate/reward_mean": 0.5, "policy/optimizer_steps": 2})
    # readable before close: a killed run keeps every finished step
    assert lines(tmp_path / "metrics.jsonl") == [
        {"step": 1, "generate/reward_mean": 0.5, "policy/optimizer_steps": 2.0}
    ]
    tracker.close()


def test_non_finite_values_are_null_in_the_file_and_nan_in_the_history(tmp_path):
    with Tracker([], output_dir=tmp_path, total_steps=1) as tracker:
        tracker.log(1, {"a": float("nan"), "b": float("inf"), "c": 1.0})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text == '{"step": 1, "a": null, "b": null, "c": 1.0}\n'
    (record,) = read_history(tmp_path)
    assert math.isnan(record["a"]) and math.isnan(record["b"]) and record["c"] == 1.0


def test_resume_drops_records_after_the_resumed_step(tmp_path):
    with Tracker([], output_dir=tmp_path, total_steps=4) as tracker:
        for step in (0, 1, 2, 3):  # step 0: eval before training
            tracker.log(step, {"x": float(step)})
    # the run was checkpointed after step 1 and resumed from there: steps 2-3 are redone
    with Tracker([], output_dir=tmp_path, total_steps=4, start_step=1) as tracker:
        # dropped with the resumed run's first record, not before (test_tracking_s48.py)
        assert [r["step"] for r in read_records(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
        tracker.log(2, {"x": 20.0})
    assert [(r["step"], r["x"]) for r in lines(tmp_path / "metrics.jsonl")] == [
        (0, 0.0),
        (1, 1.0),
        (2, 20.0),
    ]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_a_fresh_run_starts_its_own_file_and_keeps_the_earlier_one_aside(tmp_path):
    # a run killed before its first checkpoint, started again: appending gave steps
    # 1, 2, 3, 1, 2, 3 (the summary counted 6 steps and mixed both runs' rewards)
    earlier = '{"step": 1, "x": 1.0}\n{"step": 2, "x": 1.5}\n'
    (tmp_path / "metrics.jsonl").write_text(earlier)
    (tmp_path / "metrics.jsonl.1").write_text("an older one\n")
    with Tracker([], output_dir=tmp_path, total_steps=1) as tracker:
        tracker.log(1, {"x": 2.0})
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == [1]
    assert (tmp_path / "metrics.jsonl.2").read_text() == earlier  # nothing saved is lost
    assert (tmp_path / "metrics.jsonl.1").read_text() == "an older one\n"


def test_a_torn_last_line_is_ignored_but_a_torn_middle_line_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    assert read_records(path) == [{"step": 1, "x": 1.0}]
    path.write_text('{"step": 1, "x"\n{"step": 2, "x": 1.0}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:1"):
        read_records(path)


@pytest.mark.parametrize(
    ("damaged", "shown"),
    [
        (b"garbage", "'garbage'"),
        (b'{"step": 2, "x"', '\'{"step": 2, "x"\''),  # half-written, then more lines after it
        (b'{"x": 2.0}', "'{\"x\": 2.0}'"),  # JSON, but no step: was KeyError 'step'
        (b"42", "'42'"),  # JSON, not a record: was TypeError 'int' object is not subscriptable
        (b"\xff\xfe", "'\ufffd\ufffd'"),  # not UTF-8 (shown as U+FFFD): was UnicodeDecodeError
    ],
)
def test_resume_refuses_a_damaged_middle_line_naming_file_and_line_and_keeps_the_file(
    tmp_path, damaged, shown
):
    """Was a ``ValueError`` (or ``KeyError``, ``TypeError``, ``UnicodeDecodeError``): only a
    ``ConfigError`` ends ``skyrl-train`` in one line; the others gave a traceback."""
    from skyrl.config.errors import ConfigError

    path = tmp_path / "metrics.jsonl"
    saved = b'{"step": 1, "x": 1.0}\n' + damaged + b'\n{"step": 3, "x": 3.0}\n'
    path.write_bytes(saved)
    expected = (
        f"trainer.output_dir: {path}:2 is not a metrics record: {shown}; fix or delete "
        "that line, then run again (the file was left as it was)"
    )
    with pytest.raises(ConfigError) as info:
        Tracker([], output_dir=tmp_path, total_steps=4, start_step=3)
    assert str(info.value) == expected
    assert path.read_bytes() == saved  # nothing saved is lost: not truncated, not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    with pytest.raises(ConfigError) as info:  # the summary and sweep read path, the same line
        read_history(tmp_path)
    assert str(info.value) == expected


def test_resume_drops_a_torn_last_line_and_appends_after_the_last_whole_record(tmp_path):
    """A run killed mid-write leaves a torn last line; the resumed run drops it."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    with Tracker([], output_dir=tmp_path, total_steps=2, start_step=1) as tracker:
        tracker.log(2, {"x": 2.0})
    assert path.read_text() == '{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n'
