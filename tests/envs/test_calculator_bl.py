"""The calculator's size refusals say what is too big: a result too large, or one whose
denominator is (a tiny or too precise result), and refuse only past ``MAX_INT_BITS``."""

from __future__ import annotations

import pytest

from skyrl.envs.tools import calculator

TOO_LARGE = "error: result too large (over 10000 bits)"
TOO_FINE = "error: result too small or too precise (its denominator is over 10000 bits)"


@pytest.mark.parametrize(
    ("expression", "output"),
    [
        ("10**-5000", TOO_FINE),  # 1 / 10^5000: 5000 * log2(10) = 16610 bits below the line
        ("-10**-5000", TOO_FINE),
        ("1e-5000", TOO_FINE),  # the literal's denominator 10^5000 again
        ("0.5**20000", TOO_FINE),  # 1 / 2^20000: 20001 bits
        ("1 / 10**3000 / 10**100", TOO_FINE),  # 1 / 10^3100: 3100 * 3.3219 = 10298 bits
        ("(2/3)**9000", TOO_FINE),  # 3^9000: 9000 * log2(3) = 14265 bits
        ("2**20000", TOO_LARGE),  # 20001 bits
        ("1e5000", TOO_LARGE),  # 10^5000: 16610 bits
        ("(3/2)**8000", TOO_LARGE),  # 3^8000: 12680 bits; its denominator 2^8000 is 8001
        ("(2/3)**-8000", TOO_LARGE),  # the same number
    ],
)
def test_a_refusal_names_what_is_too_big(expression, output):
    assert calculator(expression) == output


def test_a_power_within_the_limit_is_computed():
    """MAX_INT_BITS is the largest integer built: 2^9999 has 10000 bits (the old bound,
    bit_length(2) * 9999 = 19998, refused it)."""
    assert calculator("2**9999") == str(2**9999)
    assert calculator("(1/2)**9999 * 2**9999") == "1"  # 1/2^9999: a 10000-bit denominator
    assert calculator("1**-100000") == "1"  # 1^n has 1 bit whatever n
