"""gsm8k_grpo's prepare.py reads a jsonl file the way skyrl's prompt loader does: a line ends
at ``\\n`` only, and a UTF-8 BOM is skipped; a line that is not UTF-8 names its row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

RECORDS = [
    # U+2028 and U+0085 are line breaks to str.splitlines, not to JSON or to skyrl's loader
    {"question": "Tom has 3 apples\u2028and buys 2.\u0085How many?", "answer": "3+2=5\n#### 5"},
    {"question": "What is 1+1?", "answer": "1+1=2\n#### 2"},
]


@pytest.fixture
def prepare(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(REPO))
    from recipes.gsm8k_grpo import prepare

    return prepare


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig"])  # utf-8-sig: a leading BOM
def test_prepare_reads_every_row_skyrl_reads(tmp_path: Path, prepare, encoding: str):
    from skyrl.data import load_prompt_file

    raw, out = tmp_path / "raw.jsonl", tmp_path / "train.jsonl"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS)
    raw.write_text(text, encoding=encoding)
    assert len(load_prompt_file(raw, prompt_key="question")) == 2  # the loader reads both

    prepare.main(["--input", str(raw), "--output", str(out)])
    rows = load_prompt_file(out)
    assert [r.extras["answer"] for r in rows] == ["5", "2"]
    assert rows[0].prompt.startswith("Tom has 3 apples\u2028and buys 2.\u0085How many?\n")


def test_prepare_names_the_row_that_is_not_utf8(tmp_path: Path, prepare, capsys):
    raw, out = tmp_path / "raw.jsonl", tmp_path / "train.jsonl"
    raw.write_bytes(b'{"question": "q", "answer": "#### 1"}\n\n{"question": "\xff"}\n')
    with pytest.raises(SystemExit) as exit_:
        prepare.main(["--input", str(raw), "--output", str(out)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: --input {raw}: row 3: not UTF-8 text\n"
    assert not out.exists()
