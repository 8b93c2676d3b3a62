"""``#### `` answers: the commas of a tuple, interval or set are not thousands separators.

``#### [0,100]`` was read as ``[0100]`` and ``#### (3,400)`` as ``(3400)``, so a correct
interval or point scored 0 against its gold, while the same answer boxed or with a space
after the comma scored 1."""

import pytest

from skyrl.envs.grading import extract_answer, grade


@pytest.mark.parametrize(
    ("reply", "gold"),
    [
        ("so #### [0,100]", "[0,100]"),
        ("so #### (3,400)", "(3,400)"),
        ("so #### (100,200).", "(100,200)"),
        ("so #### \\{100,200\\}", "\\{100,200\\}"),
    ],
)
def test_bracketed_items_keep_their_commas(reply, gold):
    assert extract_answer(reply) == gold
    assert grade(reply, gold) == 1.0


def test_a_bracketed_answer_is_not_a_grouped_number():
    # (3,400) is a point, not 3400
    assert grade("so #### (3,400)", "3400") == 0.0


def test_thousands_separators_still_dropped():
    assert extract_answer("so #### 1,234,567.") == "1234567"
    assert extract_answer("so #### $1,000") == "$1000"
    assert grade("so #### 12,500", "12500") == 1.0
