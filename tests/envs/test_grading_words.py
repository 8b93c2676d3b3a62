"""Grading word golds, grading independent of what was graded before, and long replies."""

import time

import pytest

from skyrl.envs.grading import extract_answer, grade
from skyrl.envs.tool_env import ToolEnv
from skyrl.envs.tools import calculator


@pytest.mark.parametrize(
    ("text", "gold", "reward"),
    [
        # math-verify reads bare letters as a commutative product: anagrams matched
        ("\\boxed{sey}", "yes", 0.0),
        ("\\boxed{on}", "no", 0.0),
        ("\\boxed{ddo}", "odd", 0.0),
        ("\\boxed{neve}", "even", 0.0),
        ("\\boxed{no}", "yes", 0.0),
        ("\\boxed{\\text{odd}}", "\\text{even}", 0.0),
        ("\\boxed{\\text{no solution}}", "\\text{one solution}", 0.0),
        # the same words, with or without \text{}, in any case, with a trailing period
        ("\\boxed{even}", "\\text{even}", 1.0),  # was 0: e is Euler's number, "even" e^2*n*v
        ("\\boxed{\\text{Even}}", "even", 1.0),
        ("\\boxed{true}", "\\text{true}", 1.0),  # was 0
        ("\\boxed{\\text{true}}", "true", 1.0),  # was 0
        ("\\boxed{Neither.}", "\\text{neither}", 1.0),
        ("<answer>No  Solution</answer>", "\\text{no solution}", 1.0),
        ("\\boxed{YES}", "yes", 1.0),
        # a single letter (a choice) is still math-verify's
        ("\\boxed{(C)}", "\\text{(C)}", 1.0),
        ("\\boxed{C}", "\\text{(C)}", 1.0),
        ("\\boxed{D}", "\\text{(C)}", 0.0),
        ("\\boxed{x^2+1}", "1+x^2", 1.0),
        # the price, documented: bare letters are a word, not a product
        ("\\boxed{yx}", "xy", 0.0),
    ],
)
def test_a_word_gold_needs_the_same_words(text, gold, reward):
    assert grade(text, gold) == reward


def test_a_grade_does_not_depend_on_what_was_graded_before():
    # math-verify caches parses keyed on the text alone; the cost guard's unevaluated parse
    # of an answer "e" was read back as the gold "e", which then missed E (Euler's number)
    grade("\\boxed{e}", "\\frac{7}{9}")  # "e" graded as an answer first
    assert grade("\\boxed{E}", "e") == 1.0
    grade("\\boxed{\\mathrm{e}}", "\\frac{7}{9}")
    assert grade("\\boxed{\\mathrm{e}}", "e^{1}") == 1.0


def test_grading_leaves_no_unevaluated_parse_behind():
    import sympy
    from math_verify import parse

    grade("\\boxed{e}", "\\frac{1}{2}")
    assert parse("$e$")[0] == sympy.E  # not the unevaluated exp(1) the cost guard parsed


REPEATS = 10_000
"""Unclosed tags in a degenerate reply (80,000 to 120,000 chars). A search from each open tag
to the end read 10,000 * 40,000 chars on average: 4 s here per scan; one pass takes ms."""


def test_a_reply_of_many_unclosed_answer_tags_is_read_in_one_pass():
    start = time.perf_counter()
    assert extract_answer("<answer>" * REPEATS) is None
    assert extract_answer("<answer>7</answer>" + "<answer>" * REPEATS) == "7"  # the last closed
    assert time.perf_counter() - start < 1.0


def test_the_tool_env_reads_many_unclosed_tags_in_one_pass():
    env = ToolEnv(tool_format="tags")
    env.use_native_tools(None, "no tool support")
    env.init("What is 6 * 7?", {"answer": "42"})
    start = time.perf_counter()
    result = env.step("<answer>" * REPEATS + "<python>" * REPEATS + "<calculator>" * REPEATS)
    assert (result.reward, result.done) == (0.0, True)  # no call, no answer: graded, 0
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    ("text", "output"),
    [
        ("<calculator>6 * 7</calculator> <python>print(1)</python>", "42"),
        ("<python>print(6 * 7)</python> <calculator>1</calculator>", "42\n"),
        # an unclosed tag is not a call; the first closed one is
        ("<python>print( <calculator>6 * 7</calculator>", "42"),
        (
            "<calculator>6 * <calculator>6 * 7</calculator>",
            "error: invalid syntax (<unknown>, line 1)",
        ),
    ],
)
def test_the_first_closed_tag_is_the_call(text, output):
    env = ToolEnv(tool_format="tags")
    env.use_native_tools(None, "no tool support")
    env.init("What is 6 * 7?", {"answer": "42"})
    assert env.step(text).observations == [{"role": "tool", "content": output}]


def test_a_bold_number_is_the_number():
    assert grade("\\boxed{\\mathbf{42}}", "42") == 1.0  # was 0: not read as a plain number
    assert grade("\\boxed{\\mathbf{41}}", "42") == 0.0


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        # was "unsupported expression: BinOp(left=Constant(value=2), op=BitXor(), right=Constant(va"
        ("2^3", "error: unsupported: 2^3 (^ is not a power: write **)"),
        ("abs(-3)", "error: unsupported: abs(-3)"),
        ("sqrt(" + "1+" * 40 + "1)", "error: unsupported: sqrt(" + "1+" * 26 + "..."),  # 57 chars
    ],
)
def test_the_calculator_names_what_it_cannot_evaluate_as_written(expression, error):
    assert calculator(expression) == (
        f"{error}; the calculator takes numbers, + - * / // % ** and ( )"
    )
