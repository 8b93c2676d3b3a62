"""recipes/gsm8k_grpo/prepare.py converts a parquet split whatever its other columns hold: it
reads only ``question`` and ``answer`` (the rows it writes have nothing else). A column it
never used, holding a value no Python object holds (a timestamp past year 9999), ended it in
pyarrow's OverflowError traceback. A parquet file without a GSM8K column is still one line
naming the column and the columns the file has."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.fixture
def prepare(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # the repo root
    from recipes.gsm8k_grpo import prepare

    return prepare


def test_a_column_it_does_not_use_is_not_read(tmp_path, prepare, capsys):
    raw, out = tmp_path / "train.parquet", tmp_path / "out" / "train.jsonl"
    when = pa.array([0, 10**13], pa.timestamp("s"))  # 10**13 s: about year 318857
    table = pa.table(
        {"question": ["2 + 3?", "4 + 4?"], "answer": ["#### 5", "#### 8"], "when": when}
    )
    pq.write_table(table, raw)
    prepare.main(["--input", str(raw), "--output", str(out)])
    assert capsys.readouterr().out == f"wrote 2 prompts to {out}\n"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["answer"], r["data_source"]) for r in rows] == [("5", "gsm8k"), ("8", "gsm8k")]


def test_a_missing_column_names_the_columns_the_file_has(tmp_path, prepare, capsys):
    raw, out = tmp_path / "train.parquet", tmp_path / "out" / "train.jsonl"
    pq.write_table(pa.table({"q": ["2 + 3?"], "answer": ["#### 5"]}), raw)
    with pytest.raises(SystemExit) as exit_:
        prepare.main(["--input", str(raw), "--output", str(out)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"error: --input {raw}: missing column 'question' (has ['answer', 'q'])\n"
    )
    assert not out.parent.exists()  # nothing written
