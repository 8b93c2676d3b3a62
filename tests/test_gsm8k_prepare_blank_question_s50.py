"""recipes/gsm8k_grpo/prepare.py refuses a record whose question is blank, naming the file
and row: it became a prompt of the answer-format instruction alone, which the trainer's
loader and dry run accept (not blank), so the policy trained on a question it never saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skyrl.data import load_prompt_file


@pytest.fixture
def prepare(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # the repo root
    from recipes.gsm8k_grpo import prepare

    return prepare


@pytest.mark.parametrize("question", ["", "  \n\t"])
def test_a_blank_question_names_the_file_and_row(tmp_path, capsys, prepare, question):
    raw, out = tmp_path / "raw.jsonl", tmp_path / "out" / "train.jsonl"
    records = [
        {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
        {"question": question, "answer": "x\n#### 5"},
    ]
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SystemExit) as exit_:
        prepare.main(["--input", str(raw), "--output", str(out)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"error: --input {raw}: row 2: column 'question' is blank: {question!r}\n"
    )
    assert not out.parent.exists()  # nothing written


def test_questions_are_kept_stripped(tmp_path, prepare):
    raw, out = tmp_path / "raw.jsonl", tmp_path / "train.jsonl"
    raw.write_text(json.dumps({"question": " What is 2 + 3? \n", "answer": "#### 5"}) + "\n")
    prepare.main(["--input", str(raw), "--output", str(out)])
    [row] = load_prompt_file(out)
    assert row.prompt == f"What is 2 + 3?\n{prepare.INSTRUCTION}"
    assert row.extras == {"answer": "5"}
