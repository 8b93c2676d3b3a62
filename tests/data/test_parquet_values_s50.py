"""A parquet value no Python object holds (a timestamp past year 9999, a date32 past
``datetime.date``'s range) is one line naming the file, row and column, as any other bad
row is; it was pyarrow's OverflowError as a traceback before anything started."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skyrl.data import PromptDataError, load_prompt_file
from skyrl.data import prompts as prompts_module


@pytest.mark.parametrize(
    ("column", "problem"),
    [
        # 10**13 s after 1970 is about year 318857
        (pa.array([0, 0, 10**13], pa.timestamp("s")), "date value out of range"),
        (pa.array([0, 0, 10**9], pa.date32()), "days=1000000000; must have magnitude"),
    ],
)
def test_a_value_python_cannot_hold_names_file_row_and_column(tmp_path, column, problem):
    path = tmp_path / "dates.parquet"
    table = pa.table({"prompt": ["a", "b", "c"], "answer": ["1", "2", "3"], "when": column})
    pq.write_table(table, path)
    with pytest.raises(PromptDataError) as caught:
        load_prompt_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: row 3: column 'when' cannot be read (")
    assert problem in message


def test_the_row_counts_across_record_batches(tmp_path, monkeypatch):
    """Rows are read two at a time here: the bad row 5 is the first row of the third batch."""
    monkeypatch.setattr(prompts_module, "PARQUET_BATCH_ROWS", 2)
    path = tmp_path / "late.parquet"
    stamps = pa.array([0, 0, 0, 0, 10**13], pa.timestamp("s"))
    pq.write_table(pa.table({"prompt": list("abcde"), "when": stamps}), path)
    with pytest.raises(PromptDataError) as caught:
        load_prompt_file(path)
    assert str(caught.value).startswith(f"{path}: row 5: column 'when' cannot be read (")


def test_readable_dates_load(tmp_path):
    path = tmp_path / "ok.parquet"
    stamps = pa.array([0, 86400], pa.timestamp("s"))
    pq.write_table(pa.table({"prompt": ["a", "b"], "when": stamps}), path)
    assert [str(r.extras["when"]) for r in load_prompt_file(path)] == [
        "1970-01-01 00:00:00",
        "1970-01-02 00:00:00",
    ]
