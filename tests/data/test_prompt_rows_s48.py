"""Prompt rows from files: a message role outside system / user / assistant / tool is refused
at load, naming the file, the row and the role; a NaN ``extra_info`` field of a parquet
struct column hides no column, as a null does."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import skyrl
from skyrl.config import ConfigError
from skyrl.data import PromptDataError, load_prompt_file
from skyrl.data.checked import source_rows


def write_rows(path, records) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("role", ["wizard", "developer", "User", "human"])
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_unknown_role_is_refused_naming_file_row_and_role(tmp_path, suffix, role):
    """Before, any string role passed: a chat template that renders any role (Qwen's
    ``<|im_start|>wizard``) took it, and with an external agent the endpoint answered every
    request of the row 400 (``messages[1].role``). ``developer`` too: the endpoint renders it
    as ``system``, the agent loop would hand it to the template as it is (two prompts for one
    row); ShareGPT's ``human`` and a capitalised ``User`` are other templates' spellings."""
    path = tmp_path / f"roles{suffix}"
    ok = [{"role": "user", "content": "1+1?"}]
    bad = [{"role": "system", "content": "Be brief."}, {"role": role, "content": "hi"}]
    write_rows(path, [{"prompt": ok}, {"prompt": bad}])
    with pytest.raises(PromptDataError) as caught:
        load_prompt_file(path)
    # row 2, its second message (0-based index 1)
    assert str(caught.value) == (
        f"{path}: row 2: message 1 has role {role!r}, not one of system, user, assistant, tool"
    )


def test_the_four_roles_load(tmp_path):
    """A prompt of every known role, tool included (an earlier call's result), loads as is."""
    prompt = [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "2*3?"},
        {"role": "assistant", "content": "calc(2*3)"},
        {"role": "tool", "content": "6"},
    ]
    write_rows(tmp_path / "ok.jsonl", [{"prompt": prompt}])
    assert load_prompt_file(tmp_path / "ok.jsonl")[0].prompt == prompt


def test_the_pre_flight_names_the_file_key_and_the_role(tmp_path):
    """Through the run's check (``source_rows``, which the pre-flight and the loaders use):
    one ``ConfigError`` whose key is the file's."""
    path = tmp_path / "d.jsonl"
    write_rows(path, [{"prompt": [{"role": "wizard", "content": "hi"}], "answer": "1"}])
    cfg = skyrl.compose(
        ["experiment=smoke", "data.source=files", f"data.train_files=[{path}]"],
    )
    with pytest.raises(ConfigError) as caught:
        list(source_rows(cfg, "train"))
    assert caught.value.key == "data.train_files[0]"
    assert caught.value.message == (
        f"{path}: row 1: message 0 has role 'wizard', not one of system, user, assistant, tool"
    )


def test_parquet_extra_info_nan_field_keeps_the_row_s_own_column(tmp_path):
    """A NaN field of a parquet struct column (a float field the row has no value for, written
    by pandas) hides no column, as a null does; a real value still wins."""
    records = [
        {"prompt": "1+1?", "answer": "2", "extra_info": {"answer": float("nan"), "i": 0}},
        {"prompt": "1+2?", "answer": "3", "extra_info": {"answer": None, "i": 1}},
        {"prompt": "1+3?", "answer": "4", "extra_info": {"answer": 5.0, "i": 2}},
    ]
    # answer: a string column; extra_info.answer: a float field (NaN, null, 5.0)
    write_rows(tmp_path / "n.parquet", records)
    rows = load_prompt_file(tmp_path / "n.parquet")
    assert [r.extras for r in rows] == [
        {"answer": "2", "i": 0},  # NaN: the column's "2" stays
        {"answer": "3", "i": 1},  # null: the column's "3" stays
        {"answer": 5.0, "i": 2},  # a value: merged over the column's "4"
    ]
