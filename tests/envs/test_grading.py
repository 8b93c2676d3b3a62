"""Grading: a plain-number gold takes only a plain number; no answer makes math-verify build a huge number."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl.envs import grading
from skyrl.envs.grading import extract_answer, grade

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "text",
    [
        "#### 23 + 5",  # the question, copied
        "#### 4 * 7",
        "#### 56/2",
        "#### 30 - 2",
        "#### 28 - 0",
        "#### 1 = 28",  # math-verify reads an equation as its right-hand side
        "#### x = 28",
        "#### 28 = 28",
        "#### 28 apples",
        "#### The answer is 28",
        "#### 2.8%",  # neither 2.8 nor 2.8/100 (28%: test_grading_s47.py)
        "\\boxed{\\frac{56}{2}}",
        "\\boxed{23+5}",
        "<answer>23 + 5</answer>",
        "#### 28, 29",  # not a thousands separator
        "#### 2.8e1",
    ],
)
def test_an_unsolved_expression_does_not_match_a_numeric_gold(text):
    assert grade(text, "28") == 0.0


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("23 + 5 = 28\n#### 28", "28"),
        ("#### 28.", "28"),
        ("#### 28.0", "28"),
        ("#### $28", "28"),
        ("#### $28$", "28"),
        ("#### \\$28", "28"),
        ("\\boxed{28}", "28"),
        ("#### \\boxed{28}", "28"),
        ("\\boxed{\\text{28}}", "28"),
        ("<answer> 28 </answer>", "28"),
        ("#### 1,000", "1000"),
        ("<answer>1,000</answer>", "1000"),
        ("#### 1000", "1,000"),
        ("\\boxed{1{,}000}", "1000"),
        ("#### -3", "-3"),
        ("#### \u22123", "-3"),  # a typographic minus
        ("#### 2.50", "2.5"),
        ("#### 0.5", ".5"),
    ],
)
def test_a_plain_number_matches_a_numeric_gold(text, gold):
    assert grade(text, gold) == 1.0


@pytest.mark.parametrize(
    ("text", "gold"),
    [("#### 3", "-3"), ("#### 27", "28"), ("#### 1,00", "100"), ("#### 2.51", "2.5")],
)
def test_a_different_number_does_not_match(text, gold):
    assert grade(text, gold) == 0.0


def test_thousands_separators_only_are_removed():
    assert extract_answer("so #### 1,234,567.") == "1234567"
    assert extract_answer("#### 28, 29") == "28, 29"
    assert extract_answer("#### (1,2)") == "(1,2)"


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("#### 42", "42"),
        ("\\boxed{42}", "42"),
        # the last answer marker wins, whichever kind it is
        ("#### 42\n\\boxed{41}", "41"),
        ("\\boxed{41}\n#### 42", "42"),
        ("#### \\boxed{28}", "28"),  # the box starts after the ####
        # a #### markdown heading (a capitalised word first) is not an answer marker ...
        ("#### Step 1: add\n2+40=42\n#### Final Answer\n\\boxed{42}", "42"),
        ("### Step 1\n...\n#### Final Answer\nThe answer is $\\boxed{42}$", "42"),
        ("#### 42\n\n#### Explanation\nI added 2 and 40.", "42"),
        ("\\boxed{42}\n#### **Why**\nI added 2 and 40.", "42"),
        ("\\boxed{42}\n##### Check\nfine", "42"),  # a level-5 heading
        # ... unless there is no other: then it is the answer, as before (and scores 0)
        ("#### The answer is 28", "The answer is 28"),
        # markdown bold around the answer is dropped
        ("#### **42**", "42"),
        ("#### **1,000**.", "1000"),
        ("<answer>**7**</answer>", "7"),
    ],
)
def test_the_last_answer_marker_is_the_answer(text, answer):
    assert extract_answer(text) == answer


def test_a_degenerate_reply_of_unclosed_boxes_is_read_in_one_pass(monkeypatch):
    # 5000 unclosed boxes (35,000 chars, what a policy stuck repeating writes): scanning to
    # the end from each would read 5000 * 17,500 chars on average, seconds under the env
    # limit. Count what the brace scan reads instead of timing it: one pass reads each
    # reply once (35,000 and 35,002 chars), a rescan per box ~87.5 million.
    scanned: list[int] = []
    braces = grading._BRACE

    class CountingBraces:
        def finditer(self, text):
            scanned.append(len(text))
            return braces.finditer(text)

    monkeypatch.setattr(grading, "_BRACE", CountingBraces())
    assert extract_answer("\\boxed{" * 5000) is None
    assert extract_answer("\\boxed{" * 5000 + "7}") == "7"  # the innermost box closes
    assert scanned == [35_000, 35_002]


@pytest.mark.parametrize(
    "text",
    [
        "#### Step 1: add\n2+40=42\n#### Final Answer\n\\boxed{42}",
        "### Step 1\n...\n#### Final Answer\nThe answer is $\\boxed{42}$",
        "#### 42\n\n#### Explanation\nI added 2 and 40.",
        "#### **42**",
    ],
)
def test_a_heading_or_bold_does_not_cost_a_correct_answer_its_reward(text):
    assert grade(text, "42") == 1.0


@pytest.mark.parametrize(
    ("answer", "gold", "reward"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),
        ("#### 0.5", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
        ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", 1.0),
        ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
        # a numeric gold wants the number itself, not a fraction that equals it
        ("\\boxed{\\frac{1}{2}}", "0.5", 0.0),
        # moderate powers, factorials and matrices are still graded, under the cost bounds
        ("\\boxed{2^{10} \\cdot \\frac{1}{2}}", "\\frac{1024}{2}", 1.0),
        ("\\boxed{\\frac{1}{5!}}", "\\frac{1}{120}", 1.0),
        ("\\boxed{\\frac{1}{2^{100}}}", "2^{-100}", 1.0),
        ("\\boxed{\\sqrt{2^{10}}}", "2^5", 1.0),
        ("\\boxed{(x+1)^{3}}", "x^3+3x^2+3x+1", 1.0),
        (
            "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}",
            "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
            1.0,
        ),
    ],
)
def test_a_non_numeric_gold_is_still_graded_by_math_verify(answer, gold, reward):
    assert grade(answer, gold) == reward


COSTLY_ANSWERS = [
    "9^{9^{9}}",
    "10^{10^{10}}",
    "(((9^{99})^{99})^{99})^{99}",
    "9^{99999999}",
    "1000000!",
    "\\Gamma(1000000)",
    "\\binom{1000000}{500000}",
    "\\sum_{i=1}^{1000000} i^{i}",
    "\\prod_{i=1}^{9999} i^{i}",
    "\\sqrt{2^{50000}+1}",  # sympy's root extraction is ~cubic in the bits
    "(a+b+c+d+e+f+g)^{30}",  # math-verify expands: 1.9 million terms
    "\\frac{(x+1)^{99}}{(x+2)^{99}}",
    "\\int_0^1 x^{99999} dx",
    "\\operatorname{zeros}(30000, 30000)",  # built by the parser itself
    "\\det \\begin{pmatrix}a&b&c&d&e\\\\f&g&h&i&j\\\\k&l&m&n&o\\\\p&q&r&s&t\\\\u&v&w&x&y\\end{pmatrix}",
]

# Grades each answer on a thread, as the agent loop's env pool does, and reports the CPU
# seconds that thread took (wall time on a loaded machine says nothing: at load average 20 on
# 2 cores a 0.1 s grade took 1.1 s). It runs in a child process: a grade that holds the GIL
# would freeze pytest itself; one that never ends gives no result within JOIN_S.
GRADE_IN_THREADS = """
import json, sys, threading, time
from skyrl.envs.grading import grade

JOIN_S = 20.0

def in_thread(text, gold):
    result = []

    def run():
        start = time.thread_time()
        reward = grade(text, gold)
        result.append((reward, time.thread_time() - start))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(JOIN_S)
    return result[0] if result else (None, None)

in_thread("\\\\boxed{1}", "\\\\frac{1}{2}")  # imports math-verify outside the clock
for text, gold in json.loads(sys.argv[1]):
    print(json.dumps([text, *in_thread(text, gold)]), flush=True)
"""


def test_an_answer_that_is_costly_to_grade_scores_0_quickly_off_the_main_thread():
    # off the main thread math-verify has no timeout, and sympy's arithmetic holds the
    # GIL: before the guard each of these froze the process for seconds to forever
    cases = [(f"\\boxed{{{a}}}", "\\frac{1}{2}") for a in COSTLY_ANSWERS]
    cases.append(("#### 9^{9^{9}}", "28"))  # a numeric gold never reaches math-verify
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", GRADE_IN_THREADS, json.dumps(cases)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"grading froze; graded before that: {err.stdout}")
    assert done.returncode == 0, done.stderr
    graded = [json.loads(line) for line in done.stdout.splitlines()]
    assert [text for text, _, _ in graded] == [text for text, _ in cases]
    for text, reward, cpu_seconds in graded:
        assert reward == 0.0 and cpu_seconds < 1.0, (text, reward, cpu_seconds)


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        ("\\boxed{10,\\!000}", "10000"),  # MATH's own thousands separator
        ("#### 10,\\!000", "10000"),
        ("\\boxed{10\\,000}", "10000"),  # a thin space
        ("\\boxed{10\\,000}", "10,\\!000"),
        ("\\boxed{1,\\!234,\\!567}", "1234567"),
        ("\\boxed{1{,}000}", "1000"),
    ],
)
def test_latex_thousands_separators_are_ignored(text, gold):
    assert grade(text, gold) == 1.0


def test_a_latex_separator_outside_digit_groups_is_not_a_number():
    from skyrl.envs.grading import plain_number

    assert plain_number("10,\\!000") == 10000 and plain_number("10\\,000") == 10000
    assert plain_number("1\\,5") is None  # "1,5": not a group of three
    assert grade("\\boxed{1\\,00}", "100") == 0.0  # "1,00", as "#### 1,00" scores 0
