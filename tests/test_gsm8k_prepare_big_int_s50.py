"""recipes/gsm8k_grpo/prepare.py names the row of a jsonl line holding an integer past
Python's 4300-digit limit, as its docstring promises for a bad file (and as skyrl's loader
does); the line was json's own message, with no row and advice to call
``sys.set_int_max_str_digits``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_an_integer_past_the_digit_limit_names_the_row(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # the repo root
    from recipes.gsm8k_grpo import prepare

    raw, out = tmp_path / "raw.jsonl", tmp_path / "out" / "train.jsonl"
    ok = json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"})
    raw.write_text(f'{ok}\n{{"question": "q", "answer": "#### 1", "id": {"9" * 5000}}}\n')
    with pytest.raises(SystemExit) as exit_:
        prepare.main(["--input", str(raw), "--output", str(out)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"error: --input {raw}: row 2: unreadable JSON (Exceeds the limit (4300 digits) for "
        "integer string conversion: value has 5000 digits): write such a number as a string\n"
    )
    assert not out.parent.exists()  # nothing written
