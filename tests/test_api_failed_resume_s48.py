"""A run dir reused by a later ``skyrl.train`` (a notebook's next call): a resume that fails
before it saves a checkpoint leaves the saved config that describes the dir's checkpoints,
which ``skyrl-eval`` reads the run's model from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyrl
from skyrl import api
from skyrl.config.errors import ConfigError
from skyrl.models.tiny import build_tiny_model


def checkpoint(run: Path, step: int, dp_size: int = 2) -> Path:
    """A complete checkpoint of ``run`` at ``step`` (as the trainer leaves it) and ``latest``;
    saved by ``dp_size`` ranks (the smoke experiment's), each with its RNG state file."""
    ckpt = run / "checkpoints" / f"global_step_{step}"
    (ckpt / "policy").mkdir(parents=True)
    for rank in range(dp_size):
        (ckpt / "policy" / f"rng_rank{rank}.pt").write_bytes(b"")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "kl_coef": 0.0}))
    (run / "checkpoints" / "latest").write_text(f"global_step_{step}\n")
    return ckpt


def first_run(monkeypatch, out: Path) -> str:
    """The smoke run on ``skyrl-tiny``, its 2 steps checkpointed; its saved config's text."""

    def run(checked, out):
        checkpoint(out, 2)
        return api.TrainResult(out)

    monkeypatch.setattr(api, "_run", run)
    skyrl.train(skyrl.compose(["experiment=smoke"]), output_dir=out)
    return (out / "resolved_config.yaml").read_text()


def second_run(out: Path):
    """The same dir with another model.path (a local folder) and more steps: a resume."""
    overrides = ["experiment=smoke", f"model.path={build_tiny_model()}", "trainer.total_steps=4"]
    return skyrl.train(skyrl.compose(overrides), output_dir=out)


@pytest.mark.parametrize(
    "error",
    [
        # what the trainer raised when the workers could not load global_step_2
        ConfigError("trainer.resume", "global_step_2 could not be loaded (size mismatch)"),
        KeyboardInterrupt(),  # a notebook's stop button before the first new checkpoint
    ],
)
def test_a_resume_that_fails_before_saving_keeps_the_saved_config(tmp_path, monkeypatch, error):
    # before: resolved_config.yaml named the failed run's model.path and total_steps 4, and
    # skyrl-eval of global_step_2 exported it with that model ("its policy weights do not fit")
    out = tmp_path / "run"
    saved = first_run(monkeypatch, out)
    assert "path: skyrl-tiny" in saved and "total_steps: 2" in saved

    def failed(checked, out):
        raise error

    monkeypatch.setattr(api, "_run", failed)
    with pytest.raises(type(error)):
        second_run(out)
    assert (out / "resolved_config.yaml").read_text() == saved


def test_a_resume_that_saved_a_checkpoint_keeps_its_own_config(tmp_path, monkeypatch):
    # global_step_3 was saved with this run's config: the dir's record is the new one
    out = tmp_path / "run"
    saved = first_run(monkeypatch, out)

    def failed_after_a_save(checked, out):
        checkpoint(out, 3)
        raise RuntimeError("a worker died in step 4")

    monkeypatch.setattr(api, "_run", failed_after_a_save)
    with pytest.raises(RuntimeError):
        second_run(out)
    now = (out / "resolved_config.yaml").read_text()
    assert now != saved
    assert f"path: {build_tiny_model()}" in now and "total_steps: 4" in now
