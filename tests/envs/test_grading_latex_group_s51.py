"""Grading: a plain number in a LaTeX group's braces (``\\boxed{{18}}``, which renders 18) is
that number against a plain-number gold; the answer was read as ``{18}``, no plain number,
and a correct reply scored 0."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl.envs.grading import grade, plain_number

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("\\boxed{{18}}", "18"),
        ("\\boxed{ {-3} }", "-3"),
        ("#### {2.5}", "2.5"),
        ("\\boxed{{1,000}}", "1000"),  # braces group, they pair nothing
        ("<answer>{42}</answer>", "42"),
    ],
)
def test_a_braced_number_matches(text, gold):
    assert grade(text, gold) == 1.0


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("\\boxed{{18}}", "19"),
        ("\\boxed{{18}{19}}", "18"),  # two groups
        ("\\boxed{{x+1}}", "18"),
        ("#### {18)", "18"),  # unmatched
        ("#### \\{18\\}", "18"),  # a set, not a group
    ],
)
def test_other_braced_texts_do_not_match(text, gold):
    assert grade(text, gold) == 0.0


def test_the_value_read():
    assert plain_number("{18}") == 18
    assert plain_number("{ - 3 }") == -3
    assert plain_number("{1,000}") == 1000
    assert plain_number("{}") is None


@pytest.mark.parametrize(
    "answer", ["(" + " " * 20_000 + "x", "{" + " " * 20_000 + "x", "(" + " " * 20_000 + "5)"]
)
def test_a_long_unclosed_bracket_is_read_in_linear_time(answer):
    # a lazy pattern for the brackets (1777e6b, 78a8b2e) took 10 s on '(' + 2,000 spaces, far
    # more on this answer (over 20 s before it was stopped), holding the GIL. Read by hand
    # now, it takes microseconds; a subprocess bounds the test if that ever regresses.
    code = (
        "import sys; from skyrl.envs.grading import plain_number; print(plain_number(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code, answer], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("5" if answer.endswith("5)") else "None")
