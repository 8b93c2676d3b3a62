"""Grading: markdown bold around a whole ``####`` line (``**#### 18**``, ``**Answer: #### 18**``)
is dropped with the answer's; the ``####`` answer was read as ``18**``, and a correct reply
scored 0 (``#### **18**``, bold inside the marker, already scored 1)."""

import pytest

from skyrl.envs.grading import extract_answer, grade


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("**#### 18**", "18"),
        ("So the total is 18.\n**Answer: #### 18**", "18"),
        ("**#### 18.**", "18"),
        ("**#### 1,234**", "1234"),
        ("**#### \\frac{1}{2}**", "\\frac{1}{2}"),
        ("#### **18**", "18"),  # bold inside the marker: as before
        ("#### 2**3", "2**3"),  # a power in Python's notation, no bold: kept
        ("#### **18** and **19**", "**18** and **19**"),  # balanced: not a bold around the line
    ],
)
def test_bold_around_the_marker_line_is_not_part_of_the_answer(text, answer):
    assert extract_answer(text) == answer


def test_a_bold_marker_line_is_graded_on_its_number():
    assert grade("**#### 18**", "18") == 1.0
    assert grade("**#### 17**", "18") == 0.0
    assert grade("**#### \\frac{1}{2}**", "\\frac12") == 1.0
