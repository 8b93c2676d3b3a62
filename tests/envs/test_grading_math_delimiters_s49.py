"""A plain-number answer in LaTeX's math delimiters, ``\\(42\\)`` or ``\\[42\\]``, is that number.

Against a plain-number gold (GSM8K's) ``<answer>$42$</answer>`` scored 1 but
``<answer>\\( 42 \\)</answer>``, the inline math instruct models write as often, scored 0: only
``$`` was dropped before the answer was read as a number."""

import pytest

from skyrl.envs.grading import grade, plain_number


@pytest.mark.parametrize(
    ("reply", "gold"),
    [
        ("<answer>\\( 42 \\)</answer>", "42"),
        ("<answer>\\[42\\]</answer>", "42"),
        ("so #### \\(-5\\)", "-5"),
        ("<answer>\\( 1{,}000 \\)</answer>", "1000"),
        ("<answer>\\(15\\%\\)</answer>", "0.15"),  # a percent: 15/100
    ],
)
def test_delimited_number_matches(reply, gold):
    assert grade(reply, gold) == 1.0


def test_delimiters_must_enclose_the_whole_answer():
    # two numbers, each in its own delimiters, are not one number
    assert plain_number("\\(4\\) and \\(2\\)") is None
    assert grade("<answer>\\(4\\) and \\(2\\)</answer>", "4") == 0.0
    assert grade("<answer>\\( 41 \\)</answer>", "42") == 0.0
