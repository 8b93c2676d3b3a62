"""reasoning-gym rows do not depend on the process's string-hash seed: 4 of its 106 datasets
(isomorphic_strings, list_functions, polynomial_multiplication, ransom_note at
reasoning-gym 0.1.x) iterate over sets of strings, so their questions changed with
``PYTHONHASHSEED``; a resumed run (a new process) then trained on other prompts than the
ones its checkpoint's loader had drawn over, and eval sets differed from run to run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PRINT_ROWS = (
    "import json, sys; from skyrl.data.generated import reasoning_gym_rows as r; "
    "rows = r(sys.argv[1], 6, 3) + r(sys.argv[1], 4, 3, 'eval', 6); "
    "print(json.dumps([[x.prompt, x.extras['answer'], x.uid] for x in rows]))"
)


def _rows(dataset: str, hash_seed: str) -> list:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", PRINT_ROWS, dataset], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dataset", ["ransom_note", "isomorphic_strings"])
def test_rows_are_the_same_under_any_hash_seed(dataset):
    rows = _rows(dataset, "1")
    assert len(rows) == 10  # 6 train + 4 eval
    assert _rows(dataset, "2") == rows
    assert _rows(dataset, "0") == rows  # hash randomization off: generated in the process


def test_a_dataset_name_that_does_not_exist_is_still_one_value_error():
    from skyrl.data.generated import reasoning_gym_rows

    with pytest.raises(ValueError, match="no_such_dataset"):
        reasoning_gym_rows("no_such_dataset", 2, 0)
