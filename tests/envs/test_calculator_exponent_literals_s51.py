"""Calculator: a literal whose exponent has 19 digits or more (past what ``Decimal`` holds)
is refused as too large or too small, as a shorter one is; the model got ``error:
[<class 'decimal.InvalidOperation'>]``. A zero literal is zero whatever its exponent
(``0e20000`` was refused as too large)."""

import pytest

from skyrl.envs.tools import MAX_INT_BITS, calculator

TOO_LARGE = f"error: result too large (over {MAX_INT_BITS} bits)"
TOO_SMALL = f"error: result too small or too precise (its denominator is over {MAX_INT_BITS} bits)"


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("1e" + "9" * 19, TOO_LARGE),
        ("2 * 1E+" + "9" * 1000, TOO_LARGE),
        ("1e-" + "9" * 19, TOO_SMALL),
        ("1e" + "9" * 18, TOO_LARGE),  # Decimal holds it: refused as before
        ("0e" + "9" * 19, "0"),
        ("0.0e20000 + 1.5", "1.5"),
        ("2.5e3", "2500"),  # unchanged
        ("1_0e2", "1000"),
    ],
)
def test_an_exponent_of_any_length_answers_in_words(expression, answer):
    assert calculator(expression) == answer
