"""Grading: a plain number in a LaTeX group's braces (``\\boxed{{18}}``, which renders 18) is
that number against a plain-number gold; the answer was read as ``{18}``, no plain number,
and a correct reply scored 0."""

import pytest

from skyrl.envs.grading import grade, plain_number


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
