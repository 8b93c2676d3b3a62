"""Calculator: input the parser itself refuses answers the model with a message it can act on.
A long run of unary signs (a degenerate reply) hit the parser's depth limit, a MemoryError
with no message, and the model got ``error: `` alone; an integer literal over 4,300 digits got
Python's advice to call ``sys.set_int_max_str_digits()``, though it is past the calculator's
own ``MAX_INT_BITS`` (about 3,000 digits) anyway."""

import math
import sys

import pytest

from skyrl.envs.tools import MAX_INT_BITS, calculator

NESTED = "error: the expression is nested too deeply; split it into several calls"


@pytest.mark.parametrize(
    "expression",
    [
        "-" * 20_000 + "1",  # the parser's MemoryError, no message
        "1+" * 5_000 + "1",  # the parser's RecursionError
        "1+" * 1_000 + "1",  # parsed, then too deep for the evaluator
    ],
)
def test_a_too_deep_expression_says_so(expression):
    assert calculator(expression) == NESTED


@pytest.mark.parametrize("digits", [4_301, 10_000])
def test_an_integer_past_the_parsers_digit_limit_is_too_large(digits):
    assert sys.get_int_max_str_digits() == 4_300  # Python's default: past MAX_INT_BITS too
    assert 4_300 * math.log2(10) > MAX_INT_BITS
    too_large = "error: result too large (over 4300 digits)"
    assert calculator("7" * digits) == too_large
    assert calculator("7" * digits + " - 1") == too_large


def test_shallow_expressions_and_other_syntax_errors_are_unchanged():
    assert calculator("-" * 50 + "3") == "3"  # an even number of minus signs
    assert calculator("1+" * 100 + "1") == "101"
    assert calculator("1 +") == "error: invalid syntax (<unknown>, line 1)"
