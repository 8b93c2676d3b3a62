"""Grading non-numeric golds: exact decimals, units, sets, functions, E-notation, percents."""

import pytest

from skyrl.envs import grading
from skyrl.envs.grading import grade


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        # math-verify rounds to 6 decimals when one side is a float: these matched
        ("0.5000001", "\\frac{1}{2}", 0.0),  # 5000001/10^7 - 1/2 = 1/10^7
        ("0.50000001", "\\frac{1}{2}", 0.0),  # 1/10^8 off
        ("0.3333333", "\\frac{1}{3}", 0.0),  # 3333333/10^7 - 1/3 = -1/(3 * 10^7)
        ("(0.5000001, 2)", "(\\frac{1}{2}, 2)", 0.0),  # inside an interval too
        ("0.5000001x", "\\frac{x}{2}", 0.0),
        # a decimal that is the gold's value exactly still matches
        ("0.5", "\\frac{1}{2}", 1.0),
        ("0.125", "\\frac{1}{8}", 1.0),
        ("-.75", "-\\frac{3}{4}", 1.0),
        ("(0.5, 1.25)", "(\\frac{1}{2}, \\frac{5}{4})", 1.0),
        ("0.5\\cdot\\frac{2}{3}", "\\frac{1}{3}", 1.0),  # 5/10 * 2/3 = 1/3 exactly
        ("1{,}000.5", "\\frac{2001}{2}", 1.0),  # a thousands separator is kept
        ("x^0.5", "\\sqrt{x}", 1.0),  # x^(5/10), not (x^0).5
        # an irrational gold takes a decimal within a relative 1e-9
        ("1.4142135624", "\\sqrt{2}", 1.0),  # sqrt(2) = 1.41421356237..: 2.6e-11 relative
        ("1.414214", "\\sqrt{2}", 0.0),  # 4.4e-7 relative: matched before (6 decimals)
        ("3.14159265359", "\\pi", 1.0),  # pi = 3.14159265358979..: 6.6e-13 relative
        ("3.1415927", "\\pi", 0.0),  # 1.5e-8 relative
    ],
)
def test_decimals_are_exact_numbers(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        ("5\\text{ m}", "5\\text{ cm}", 0.0),  # was 1: the units were dropped
        ("5\\text{ cm}^2", "5\\text{ cm}", 0.0),
        ("90^\\circ", "90\\text{ radians}", 0.0),
        ("6\\text{ cm}", "5\\text{ cm}", 0.0),
        # the same unit, however it is written
        ("5 \\text{cm}", "5\\text{ cm}", 1.0),
        ("5\\text{ centimeters}", "5\\text{ cm}", 1.0),
        ("5\\mbox{ Centimetres}", "5\\text{ cm}", 1.0),
        ("2\\text{ feet}", "2\\text{ ft}", 1.0),
        ("3\\text{ inches}", "3\\text{ in}", 1.0),
        ("90^{\\circ}", "90\\text{ degrees}", 1.0),
        ("12\\text{ square units}", "12\\text{ units}^2", 1.0),
        ("\\frac{1}{2}\\text{ hour}", "0.5\\text{ hours}", 1.0),
        # one side without a unit: the number decides, as before
        ("5", "5\\text{ cm}", 1.0),
        ("\\frac{5}{2}\\text{ m}", "\\frac{5}{2}", 1.0),
    ],
)
def test_units_must_match_when_both_sides_have_one(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        # an inequality is the set it describes (was 0)
        ("x<3", "(-\\infty,3)", 1.0),
        ("x \\ge 2", "[2,\\infty)", 1.0),
        ("x<2", "(-\\infty,3)", 0.0),
        ("x \\le 3", "(-\\infty,3)", 0.0),  # 3 is not in (-oo, 3)
        # but not for an open pair of finite numbers, which may be a point
        ("1<x<3", "(1,3)", 0.0),
        ("(1,3)", "(1,3)", 1.0),
        # nor for a finite set, which math-verify compares with an interval by its ends
        ("1<x<2", "\\{1,2\\}", 0.0),
        ("1 \\le x < 2", "[1,2)", 1.0),
    ],
)
def test_an_inequality_matches_the_set_gold_it_describes(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        ("f(x)=x^2+1", "x^2+1", 1.0),  # was 0: the cost bound raised on f, read as refused
        ("g(2)=5", "5", 0.0),  # a numeric gold still takes only a plain number
        ("g(2)=5", "\\frac{10}{2}", 1.0),
        ("f(x)=x^2+2", "x^2+1", 0.0),
    ],
)
def test_an_answer_with_an_undefined_function_is_graded(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward


def test_the_cost_bound_of_an_undefined_function_is_its_arguments():
    import sympy

    f = sympy.Function("f")
    x = sympy.Symbol("x")
    # one term; bits: 2 for the symbol x, as for a function sympy defines (sin(x): 2)
    assert grading._cost(f(x), {}) == (2, 1)


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        ("1.0e-3", "\\frac{1}{1000}", 1.0),  # was 0: e read as Euler's number
        ("2.5E3", "\\frac{5000}{2}", 1.0),
        ("1e-3", "10^{-3}", 1.0),
        ("1.0e-3", "\\frac{1}{100}", 0.0),
        ("1e99999999", "\\frac{1}{2}", 0.0),  # 10^99999999: refused by the cost bound
        # with e in the gold, e is Euler's number
        ("2e-3", "-3+2e", 1.0),
        # a numeric gold still takes only a plain number
        ("1.0e-3", "0.001", 0.0),
    ],
)
def test_e_notation_is_a_number(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        ("0.1", "10\\%", 1.0),  # was 0: 10% = 10/100 = 0.1
        ("\\frac{1}{10}", "10\\%", 1.0),
        ("0.125", "12.5\\%", 1.0),  # 12.5/100 = 1/8
        ("10", "10\\%", 1.0),  # the % left out, as before
        ("10\\%", "10\\%", 1.0),
        ("12.5", "12.5\\%", 1.0),
        # a fraction before the % made math-verify's parse of the gold fail: nothing matched
        ("1.5\\%", "\\frac{3}{2}\\%", 1.0),
        ("0.015", "\\frac{3}{2}\\%", 1.0),  # 3/2 / 100 = 3/200 = 0.015
        ("0.2", "10\\%", 0.0),
        ("0.1\\%", "10\\%", 0.0),  # 0.1% is not 10%
    ],
)
def test_a_percent_gold_takes_its_value_as_a_fraction(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward


def test_grading_keeps_math_verify_caches_for_the_evaluated_parses():
    from math_verify import parser

    grade("\\boxed{\\frac{3}{7}}", "\\frac{6}{14}")
    before = parser.parse_latex_cached.cache_info()
    assert grade("\\boxed{\\frac{3}{7}}", "\\frac{6}{14}") == 1.0
    after = parser.parse_latex_cached.cache_info()
    # the second grade reads both evaluated parses (gold, answer) back from the cache
    assert after.hits - before.hits == 2 and after.misses == before.misses
