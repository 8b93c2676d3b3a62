"""An ``<answer>`` tag that holds an answer marker (``####``, ``\\boxed{}``) answers with it.

The tools env asks for ``<answer>..</answer>`` while the arithmetic task's system prompt (the
multi_turn_tools recipe renders both) asks for ``#### <number>``: a reply obeying both,
``<answer>2 + 9 = 11\\n#### 11</answer>``, was read as the whole tag content and scored 0,
as did ``<answer>The answer is \\boxed{11}</answer>``, which scores 1 without the tag."""

import pytest

from skyrl.envs.grading import extract_answer, grade
from skyrl.envs.tool_env import ToolEnv


@pytest.mark.parametrize(
    "reply",
    [
        "<answer>#### 11</answer>",
        "<answer>\n2 + 9 = 11\n#### 11\n</answer>",
        "<answer>The answer is \\boxed{11}.</answer>",
        "<answer>#### **11**</answer>",
    ],
)
def test_the_marker_in_the_tag_is_the_answer(reply):
    assert extract_answer(reply) == "11"
    assert grade(reply, "11") == 1.0
    assert grade(reply, "12") == 0.0


def test_a_tag_without_a_marker_is_its_content():
    assert extract_answer("<answer> **11** </answer>") == "11"
    # a heading in the tag is no marker: the content stays the answer, as before
    assert extract_answer("<answer>11\n#### Explanation</answer>") == "11\n#### Explanation"
    # the tag still wins over a marker outside it
    assert extract_answer("#### 10\n<answer>11</answer>") == "11"


def test_the_tools_env_grades_a_tagged_marker():
    env = ToolEnv(tool_format="tags")
    env.init("What is 2 + 9?", {"answer": "11"})
    result = env.step("<answer>2 + 9 = 11\n#### 11</answer>")
    assert (result.reward, result.done) == (1.0, True)
