"""reasoning-gym rows of a dataset whose generator prints: ``bf`` writes a dot to stdout per
program it tries. Generated in a child process (the parent randomizes string hashes), those
dots went into the pipe the child pickles its rows back through, and ``data.source=
reasoning_gym environment.dataset=bf`` ended in an ``UnpicklingError`` traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from skyrl.data.generated import REASONING_GYM_INSTRUCTION

PRINT_ROWS = (
    "import json, sys; from skyrl.data.generated import reasoning_gym_rows as r; "
    "rows = r('bf', 3, 7) + r('bf', 2, 7, 'eval', 3); "
    "print(json.dumps([[x.prompt, x.extras['answer'], x.uid] for x in rows]))"
)


def _run(hash_seed: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run(
        [sys.executable, "-c", PRINT_ROWS], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_generator_that_prints_still_gives_its_rows():
    child = _run("1")  # hash randomization on: generated in a child process
    assert child.returncode == 0, child.stderr[-2000:]
    rows = json.loads(child.stdout)  # the rows alone: the child's dots stay out of stdout
    assert [uid for _, _, uid in rows] == [
        "bf-train-0", "bf-train-1", "bf-train-2", "bf-eval-0", "bf-eval-1",
    ]  # fmt: skip
    assert all(p.endswith(f"\n{REASONING_GYM_INSTRUCTION}") and a for p, a, _ in rows)
    here = _run("0")  # hash randomization off: generated in the process itself (dots printed)
    assert here.returncode == 0, here.stderr[-2000:]
    assert here.stdout.startswith(".")  # bf's dots, then the rows on the same line
    assert json.loads(here.stdout.lstrip(".")) == rows
