"""A long answer to a non-numeric gold scores 0 without being read for a unit: the unit
pattern is quadratic in a ``\\text{`` left open, and a 60,000-character answer (a degenerate
reply's ``<answer>``) held the GIL for ~30 s, stalling the engine and every other env thread
while the env's time limit could not fire."""

import time

import skyrl.envs.grading as grading
from skyrl.envs.grading import MAX_ANSWER_CHARS, grade, math_equal

GOLD = "5\\text{ cm}"
LONG = "5\\text{" + "ab " * 20_000  # 60,007 characters, the brace never closed


def test_a_long_answer_is_not_read_for_a_unit(monkeypatch):
    read: list[int] = []
    unit = grading._unit
    monkeypatch.setattr(grading, "_unit", lambda text: read.append(len(text)) or unit(text))
    started = time.monotonic()
    assert grade(f"<answer>{LONG}</answer>", GOLD) == 0.0
    elapsed = time.monotonic() - started
    assert read == []  # neither side: the answer is refused on its length first
    assert elapsed < 5, elapsed  # ~30 s when the unit pattern read it (~1 ms now)


def test_answers_within_the_limit_are_still_read_for_units():
    assert math_equal("5\\text{ centimeters}", GOLD)  # same unit, spelled out
    assert not math_equal("5\\text{ m}", GOLD)  # another unit
    padded = "5" + " " * (MAX_ANSWER_CHARS - 12) + "\\text{ cm}"  # 298 characters
    assert len(padded) <= MAX_ANSWER_CHARS and math_equal(padded, GOLD)
    assert not math_equal(padded + " " * 3, GOLD)  # 301: over the limit, 0 as before
