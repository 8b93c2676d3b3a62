"""A parquet map column (what Spark or DuckDB write for a dict) reads as a dict, as a jsonl
object does: a map ``extra_info`` is merged into the extras like a struct one. pyarrow reads a
map as a list of ``(key, value)`` pairs, so the row's answer stayed in a list and the
pre-flight refused the row with "no 'answer'". A map with a key twice is one line naming the
file, row and column."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skyrl.data import PromptDataError, load_prompt_file

STR_MAP = pa.map_(pa.string(), pa.string())


def test_a_map_extra_info_is_merged_like_a_struct(tmp_path):
    path = tmp_path / "spark.parquet"
    extra_info = pa.array([[("answer", "4"), ("split", "train")], [("answer", "6")]], STR_MAP)
    pq.write_table(pa.table({"prompt": ["2 + 2?", "3 + 3?"], "extra_info": extra_info}), path)
    rows = load_prompt_file(path)
    assert [r.extras for r in rows] == [{"answer": "4", "split": "train"}, {"answer": "6"}]


def test_a_map_column_reaches_the_env_as_a_dict(tmp_path):
    path = tmp_path / "meta.parquet"
    meta = pa.array([[("level", 3)]], pa.map_(pa.string(), pa.int64()))
    pq.write_table(pa.table({"prompt": ["q"], "answer": ["1"], "meta": meta}), path)
    [row] = load_prompt_file(path)
    assert row.extras == {"answer": "1", "meta": {"level": 3}}


def test_a_map_with_a_key_twice_names_file_row_and_column(tmp_path):
    path = tmp_path / "twice.parquet"
    extra_info = pa.array([[("answer", "4")], [("answer", "6"), ("answer", "7")]], STR_MAP)
    pq.write_table(pa.table({"prompt": ["a", "b"], "extra_info": extra_info}), path)
    with pytest.raises(PromptDataError) as caught:
        load_prompt_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: row 2: column 'extra_info' cannot be read (")
    assert "duplicate key was 'answer'" in message
    assert "\n" not in message
