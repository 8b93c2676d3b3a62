"""Prompt rows from files: how a dict ``extra_info`` column merges into the extras, and
files that start with a UTF-8 byte order mark."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skyrl.data import PromptDataError, load_prompt_file


def test_parquet_extra_info_null_field_keeps_the_row_s_own_column(tmp_path):
    """Parquet gives every row every field of a struct column, null where a row has none: a
    file mixing rows with ``answer`` at the top and rows with it in ``extra_info`` gave the
    first kind ``answer=None`` (the struct's null replaced the row's own value), which the
    pre-flight check then refused as "no 'answer'"."""
    records = [
        {"prompt": "1+1?", "answer": "2", "extra_info": {"index": 0}},
        {"prompt": "1+2?", "extra_info": {"index": 1, "answer": "3"}},
    ]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "mixed.parquet")
    rows = load_prompt_file(tmp_path / "mixed.parquet")
    # row 1: extra_info {"index": 0, "answer": None}: the null does not hide the column's "2"
    # row 2: the column's null is filled from extra_info's "3"
    assert [r.extras for r in rows] == [{"answer": "2", "index": 0}, {"answer": "3", "index": 1}]


def test_extra_info_nan_field_keeps_the_row_s_own_column(tmp_path):
    """NaN is pandas' missing value (a frame saved with ``to_json``): like null, it does not
    hide the row's own column."""
    record = {"prompt": "p", "answer": "2", "extra_info": {"answer": float("nan"), "i": 0}}
    (tmp_path / "n.jsonl").write_text(json.dumps(record) + "\n")  # json writes NaN
    assert load_prompt_file(tmp_path / "n.jsonl")[0].extras == {"answer": "2", "i": 0}


def test_extra_info_value_still_wins_over_a_top_level_one(tmp_path):
    """A non-null ``extra_info`` field is merged over a column of the same name, as before."""
    record = {"prompt": "p", "answer": "2", "extra_info": {"answer": "3"}}
    (tmp_path / "e.jsonl").write_text(json.dumps(record) + "\n")
    assert load_prompt_file(tmp_path / "e.jsonl")[0].extras == {"answer": "3"}


def test_byte_order_mark_before_a_blank_first_line(tmp_path):
    """A BOM on a line of its own is a blank line (skipped, its number kept), not row 1 of
    invalid JSON; a file of nothing else has no rows."""
    row = json.dumps({"prompt": "q"}).encode()
    (tmp_path / "b.jsonl").write_bytes(b"\xef\xbb\xbf\r\n" + row + b"\r\n")
    assert [r.prompt for r in load_prompt_file(tmp_path / "b.jsonl")] == ["q"]
    (tmp_path / "only.jsonl").write_bytes(b"\xef\xbb\xbf\n")
    with pytest.raises(PromptDataError) as caught:
        load_prompt_file(tmp_path / "only.jsonl")
    assert str(caught.value) == f"{tmp_path / 'only.jsonl'}: no rows"
