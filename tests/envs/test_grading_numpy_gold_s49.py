"""A numpy float gold (a pandas column's value, handed to ``grade`` by a custom env or reward
function) is read as the number it is.

``grade`` read a float gold through ``repr``, which numpy 2 writes ``np.float64(0.5)``:
``decimal.InvalidOperation`` escaped every step (an env error on each trajectory)."""

import numpy as np
import pytest

from skyrl.envs.grading import grade


@pytest.mark.parametrize("gold", [np.float64(0.5), np.float32(0.5)])
def test_numpy_float_gold(gold):
    assert grade("so #### 0.5", gold) == 1.0
    assert grade("so #### 0.4", gold) == 0.0


def test_numpy_float_gold_is_read_in_full():
    # 1e-05 is the plain number 0.00001, as for a Python float; float32's 0.1 is the 0.1 it
    # prints, not the 0.100000001490116... it stores
    assert grade("so #### 0.00001", np.float64(1e-05)) == 1.0
    assert grade("so #### 0.1", np.float32(0.1)) == 1.0
    assert grade("so #### 0.00001", 1e-05) == 1.0
