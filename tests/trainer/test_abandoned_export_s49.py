"""A run resumed from a checkpoint before the step its ``final_hf`` was exported at replaces
the steps that export holds: the export (and the LoRA adapter exported with it) is moved aside,
so skyrl-eval of the run no longer prefers it to the run's own latest checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from skyrl.trainer.checkpoint import EXPORT_RECORD, set_aside_abandoned_export


def _export(run: Path, step: int | None, adapter: bool = False) -> None:
    (run / "final_hf").mkdir(parents=True)
    (run / "final_hf" / "model.safetensors").write_text("w")
    if step is not None:
        (run / "final_hf" / EXPORT_RECORD).write_text(json.dumps({"step": step}))
    if adapter:
        (run / "final_adapter").mkdir()
        (run / "final_adapter" / "adapter_model.safetensors").write_text("a")


def test_an_export_of_a_later_step_is_moved_aside_with_its_adapter(tmp_path):
    # exported at step 4; the run resumes from global_step_2 and re-trains steps 3 and 4
    _export(tmp_path, 4, adapter=True)
    line = set_aside_abandoned_export(tmp_path, step=2, foreign=False)
    assert line == (
        f"{tmp_path / 'final_hf'} holds the weights of step 4, after step 2 this run resumes "
        "from (the steps it replaces): moved to final_hf.1, final_adapter.1"
    )
    assert not (tmp_path / "final_hf").exists() and not (tmp_path / "final_adapter").exists()
    assert (tmp_path / "final_hf.1" / "model.safetensors").read_text() == "w"
    assert (tmp_path / "final_adapter.1" / "adapter_model.safetensors").read_text() == "a"


def test_a_second_abandoned_export_takes_the_next_free_name(tmp_path):
    (tmp_path / "final_hf.1").mkdir()
    _export(tmp_path, 3)
    assert set_aside_abandoned_export(tmp_path, step=1, foreign=False).endswith(
        "moved to final_hf.2"
    )


def test_an_export_at_or_before_the_resumed_step_stays(tmp_path):
    # step 4 exported, resumed from 4 with more steps (or from a later one): still this line's
    _export(tmp_path, 4)
    assert set_aside_abandoned_export(tmp_path, step=4, foreign=False) is None
    assert set_aside_abandoned_export(tmp_path, step=6, foreign=False) is None
    _export(tmp_path / "old", None)  # an export from before the record: its step is unknown
    assert set_aside_abandoned_export(tmp_path / "old", step=2, foreign=False) is None
    assert (tmp_path / "final_hf").is_dir() and (tmp_path / "old" / "final_hf").is_dir()
    assert set_aside_abandoned_export(tmp_path / "none", step=2, foreign=True) is None


def test_a_resume_from_another_runs_checkpoint_sets_aside_any_export_here(tmp_path):
    """The export in this run dir is an earlier run's, whatever step it records (its metrics
    records are moved aside too): step 1 < the resumed step 2, and one without a record."""
    _export(tmp_path / "a", 1)
    assert set_aside_abandoned_export(tmp_path / "a", step=2, foreign=True) == (
        f"{tmp_path / 'a' / 'final_hf'} holds the weights of step 1 of another run (this one "
        "resumes from another run's checkpoint): moved to final_hf.1"
    )
    _export(tmp_path / "b", None)
    assert set_aside_abandoned_export(tmp_path / "b", step=2, foreign=True) == (
        f"{tmp_path / 'b' / 'final_hf'} holds the weights of another run (this one resumes "
        "from another run's checkpoint): moved to final_hf.1"
    )
