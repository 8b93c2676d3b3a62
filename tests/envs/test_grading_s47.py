"""The calculator refuses an empty call and True/False; grading percents, repeating decimals."""

import pytest

from skyrl.envs.grading import grade
from skyrl.envs.tool_env import ToolEnv
from skyrl.envs.tools import calculator

TAKES = "the calculator takes numbers, + - * / // % ** and ( )"


@pytest.mark.parametrize("expression", ["", "   ", "\n"])
def test_an_empty_calculator_call_is_called_empty(expression):
    # was "error: invalid syntax (<unknown>, line 0)"
    assert calculator(expression) == f"error: the call is empty; {TAKES}"


def test_an_empty_calculator_tag_tells_the_model_it_was_empty():
    env = ToolEnv(tool_format="tags")
    env.use_native_tools(None, "no tool support")
    env.init("What is 6 * 7?", {"answer": "42"})
    result = env.step("<calculator></calculator>")
    assert result.observations == [
        {"role": "tool", "content": f"error: the call is empty; {TAKES}"}
    ]
    assert not result.done


@pytest.mark.parametrize(("expression", "name"), [("True+1", "True"), ("False", "False")])
def test_true_and_false_are_names_the_calculator_refuses(expression, name):
    # was 2 and 0: bool is an int, so True read as the number 1; None was already refused
    assert calculator(expression) == f"error: unsupported: {name}; {TAKES}"
    assert calculator("None") == f"error: unsupported: None; {TAKES}"


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        # a percent answer is read as its value over 100 (was 0: a plain-number gold took
        # only a plain number, and math-verify read 15\% as 15)
        ("15\\%", "0.15", 1.0),  # 15/100 = 0.15
        ("15%", "0.15", 1.0),
        ("15 \\%", "0.15", 1.0),
        ("12.5\\%", "0.125", 1.0),  # 12.5/100 = 0.125
        ("15\\%", "\\frac{3}{20}", 1.0),  # 15/100 = 3/20
        ("10\\%", "\\frac{1}{10}", 1.0),
        # ... and as its bare number, as a percent gold takes the number without its sign
        ("15\\%", "15", 1.0),
        ("\\frac{1}{10}\\%", "\\frac{1}{10}", 1.0),
        # neither reading: 0
        ("15\\%", "0.015", 0.0),  # 15 and 0.15
        ("1.5\\%", "0.15", 0.0),  # 1.5 and 0.015
        ("15\\%", "\\frac{3}{2}", 0.0),  # 15 and 3/20
        ("\\frac{1}{10}\\%", "\\frac{1}{100}", 0.0),  # 1/10 and 1/1000
        # a percent on both sides compares the numbers before the signs, as before
        ("0.15\\%", "15\\%", 0.0),
        ("15\\%", "15\\%", 1.0),
        # the percent gold's readings are unchanged
        ("0.15", "15\\%", 1.0),
        ("15", "15\\%", 1.0),
    ],
)
def test_a_percent_answer_is_its_number_or_its_value_over_100(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward


def test_a_percent_after_hashes_is_read_as_a_percent():
    assert grade("#### 28%", "28") == 1.0  # a GSM8K percent question's gold has no sign
    assert grade("#### 28%", "0.28") == 1.0  # 28/100
    assert grade("#### 28%", "2.8") == 0.0  # neither 28 nor 0.28
    assert grade("<answer>$28\\%$</answer>", "0.28") == 1.0  # $ ignored, as for <answer>$28$


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        ("0.\\overline{3}", "\\frac{1}{3}", 1.0),  # (3 - 0) / 9 = 1/3; was 0
        ("\\frac{1}{3}", "0.\\overline{3}", 1.0),
        ("0.1\\overline{6}", "\\frac{1}{6}", 1.0),  # (16 - 1) / 90 = 15/90 = 1/6
        ("0.\\overline{142857}", "\\frac{1}{7}", 1.0),  # 142857 / 999999 = 1/7
        ("2", "1.\\overline{9}", 1.0),  # (19 - 1) / 9 = 2
        ("1.\\overline{9}", "2", 0.0),  # a plain-number gold takes only a plain number
        ("0.\\bar{3}", "\\frac{1}{3}", 1.0),
        ("33.\\overline{3}\\%", "\\frac{1}{3}", 1.0),  # (333 - 33) / 9 = 100/3; /100 = 1/3
        ("0.\\overline{3}", "\\frac{1}{30}", 0.0),
        ("0.\\overline{3}", "0.3", 0.0),  # a plain-number gold takes only a plain number
        ("0.3", "0.\\overline{3}", 0.0),  # 3/10 is not 1/3
        ("0.\\overline{6}", "\\frac{2}{3}", 1.0),  # 6/9 = 2/3
    ],
)
def test_a_repeating_decimal_is_the_fraction_it_is(answer, gold, reward):
    assert grade(f"\\boxed{{{answer}}}", gold) == reward
