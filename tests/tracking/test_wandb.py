"""wandb sink: offline by default, with the run name, config and every step's metrics."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

from skyrl.config.errors import ConfigError
from skyrl.tracking import Tracker

BLOCK_BYTES = 32 * 1024
"""The .wandb file is a LevelDB-style log: 32 KiB blocks of chunks with a 7-byte header
(crc32, length, type), after a 7-byte file header (``:W&B``, magic, version)."""
FULL, LAST = 1, 4


def read_wandb_records(path: Path) -> list[wandb_internal_pb2.Record]:
    """Decode an offline run file (wandb 0.31 ships no Python reader for it)."""
    data, pos, chunks, records = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if BLOCK_BYTES - pos % BLOCK_BYTES < 7:  # block trailer too small for a header
            pos += BLOCK_BYTES - pos % BLOCK_BYTES
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def test_offline_run_has_name_config_and_metrics(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the sink's own default: offline
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    out = tmp_path / "run"
    config = {"trainer": {"lr": 1e-6}}
    with Tracker(["wandb"], output_dir=out, total_steps=2, config=config, run_name="t1") as t:
        t.log(1, {"generate/reward_mean": 0.5, "eval/pass@1": 0.25})
        t.log(2, {"generate/reward_mean": 0.75})
    # finish() returns before wandb's service has written the run file; teardown (what
    # wandb's atexit hook does) waits for it
    wandb.teardown()

    (run_file,) = out.glob("wandb/offline-run-*/run-*.wandb")
    records = read_wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "t1"
    assert {u.key: json.loads(u.value_json) for u in run.config.update}["trainer"] == {"lr": 1e-6}
    history = [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [(h["_step"], h["generate/reward_mean"]) for h in history] == [(1, 0.5), (2, 0.75)]
    assert history[0]["eval/pass@1"] == 0.25


def test_a_failed_run_finishes_with_exit_code_1(tmp_path, monkeypatch):
    """The run file's exit record: 1 after ``close(failed=True)``, 0 after a normal close."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    for name, failed in (("ok", False), ("failed", True)):
        tracker = Tracker(["wandb"], output_dir=tmp_path / name, total_steps=2)
        tracker.log(1, {"generate/reward_mean": 0.5})
        tracker.close(failed=failed)
    wandb.teardown()

    exit_codes = {}
    for name in ("ok", "failed"):
        (run_file,) = (tmp_path / name).glob("wandb/offline-run-*/run-*.wandb")
        records = read_wandb_records(run_file)
        (exit_codes[name],) = [
            r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"
        ]
    assert exit_codes == {"ok": 0, "failed": 1}


def test_a_mode_wandb_refuses_is_one_line_naming_it(tmp_path, monkeypatch):
    """Was wandb's pydantic ``ValidationError`` (a traceback wall through ``skyrl-train``,
    where only a ``ConfigError`` ends a run in one line), naming no environment variable."""
    monkeypatch.setenv("WANDB_MODE", "bogus")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with pytest.raises(ConfigError) as info:
        Tracker(["wandb"], output_dir=tmp_path, total_steps=1)
    assert str(info.value) == (
        "trainer.loggers: logger 'wandb' could not start with WANDB_MODE='bogus': "
        "ValidationError: 1 validation error for Settings"
    )
    assert list(tmp_path.iterdir()) == []  # was an empty metrics.jsonl, moved aside next try
