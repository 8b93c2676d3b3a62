"""Grading: a negative plain number written with a space after its sign (``- 5``, as LaTeX
renders ``-5``) or in parentheses (``\\boxed{(-3)}``) is that number against a plain-number
gold; both scored 0 (the gold's first rule took only ``-5`` and ``-3`` as written)."""

import pytest

from skyrl.envs.grading import grade, plain_number


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("#### - 5", "-5"),
        ("\\boxed{- 5}", "-5"),
        ("\\boxed{(-3)}", "-3"),
        ("#### (-3)", "-3"),
        ("<answer>( -3 )</answer>", "-3"),
        ("#### - 2.5", "-2.5"),
        ("\\boxed{(7)}", "7"),
    ],
)
def test_a_spaced_or_parenthesised_signed_number_matches(text, gold):
    assert grade(text, gold) == 1.0


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("#### - 5", "5"),  # the sign still counts
        ("\\boxed{(-3)}", "3"),
        ("#### (1,000)", "1000"),  # a pair (1, 000), maybe: not read as a number
        ("#### (3)(4)", "12"),  # a product, not a parenthesised number
        ("#### 8 - 5", "3"),  # an operator between numbers is no sign
        ("#### (-3", "-3"),  # unclosed
    ],
)
def test_other_texts_are_still_no_plain_number_of_that_value(text, gold):
    assert grade(text, gold) == 0.0


def test_the_value_read():
    assert plain_number("- 5") == -5
    assert plain_number("(-3)") == -3
    assert plain_number("(+ 0.25)") == 0.25
    assert plain_number("(1,000)") is None
    assert plain_number("5 -") is None
