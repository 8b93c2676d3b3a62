"""A parquet map column (what Spark or DuckDB write for a dict) reads as a dict, as a jsonl
object does: a map ``extra_info`` is merged into the extras like a struct one. pyarrow reads a
map as a list of ``(key, value)`` pairs, so the row's answer stayed in a list and the
pre-flight refused the row with "no 'answer'". A map with a key twice is one line naming the
file, row and column."""

from __future__ import annotations

from datetime import date

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


@pytest.mark.parametrize(
    ("key_type", "key"),
    [(pa.large_string(), "level"), (pa.binary(), b"level"), (pa.date32(), date(1970, 1, 2))],
)
def test_a_map_keyed_by_what_json_cannot_key_stays_pairs(tmp_path, key_type, key):
    """Only string keys make a JSON object: a dict keyed by bytes or dates would end the run
    when the prompt loader digests its rows (``json.dumps``: keys must be str, ...)."""
    from skyrl.rollouts.dataloader import PromptLoader

    path = tmp_path / "keys.parquet"
    meta = pa.array([[(key, 3)]], pa.map_(key_type, pa.int64()))
    nested = pa.array(
        [{"inner": [(key, 3)]}], pa.struct([("inner", pa.map_(key_type, pa.int64()))])
    )
    pq.write_table(pa.table({"prompt": ["q"], "answer": ["1"], "meta": meta, "n": nested}), path)
    [row] = load_prompt_file(path)
    if key_type == pa.large_string():
        assert row.extras["meta"] == {"level": 3} and row.extras["n"] == {"inner": {"level": 3}}
    else:
        assert row.extras["meta"] == [(key, 3)] and row.extras["n"] == {"inner": [(key, 3)]}
    assert PromptLoader([row], batch_size=1, seed=0).state_dict()["order_of"]["prompts"] == 1
