"""The end-of-run report of ``skyrl.train``: a plot that cannot be written (a full disk once
the run is done) is a warning, and the summary is still printed."""

from __future__ import annotations

import json
import logging

from skyrl import api
from skyrl.tracking import summary


def test_a_plot_that_cannot_be_written_still_prints_the_summary(
    tmp_path, monkeypatch, capsys, caplog
):
    # Before: the OSError ended a finished run (its checkpoints and export saved) with exit 1
    # and no summary.
    records = [{"step": 1, "generate/reward_mean": 0.25}, {"step": 2, "generate/reward_mean": 0.75}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def full_disk(history, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(summary, "plot_history", full_disk)
    with caplog.at_level(logging.WARNING, logger=api.logger.name):
        history = api._report(tmp_path)
    assert [r["step"] for r in history] == [1, 2]
    assert "steps run: 2" in capsys.readouterr().out
    assert (
        f"{tmp_path / 'metrics.png'} not written: [Errno 28] No space left on device" in caplog.text
    )
    assert not (tmp_path / "metrics.png").exists()
