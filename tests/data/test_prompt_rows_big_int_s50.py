"""A jsonl row holding an integer longer than Python reads (4300 digits) is one line naming
the file and row, as invalid JSON is; it was ``json``'s own ValueError as a traceback."""

from __future__ import annotations

import json

import pytest

from skyrl.data import PromptDataError, load_prompt_file


def test_an_integer_past_the_digit_limit_names_the_file_and_row(tmp_path):
    path = tmp_path / "big.jsonl"
    ok = json.dumps({"prompt": "q", "answer": "1"})
    path.write_text(ok + "\n" + '{"prompt": "q", "answer": ' + "9" * 5000 + "}\n")
    with pytest.raises(PromptDataError) as caught:
        load_prompt_file(path)
    assert str(caught.value) == (
        f"{path}: row 2: unreadable JSON (Exceeds the limit (4300 digits) for integer string "
        "conversion: value has 5000 digits): write such a number as a string"
    )


def test_the_same_number_as_a_string_loads(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"prompt": "q", "answer": "9" * 5000}) + "\n")
    assert load_prompt_file(path)[0].extras == {"answer": "9" * 5000}
