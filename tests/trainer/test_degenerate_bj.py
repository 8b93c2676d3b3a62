"""``RLTrainer.train`` resumed from a checkpoint at or past ``trainer.total_steps``: one line
saying so (the checkpoint's step, ``total_steps``, what to raise), no step run. Driven
without Ray: the trainer is built with ``__new__``, its resume and workers are stubs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from skyrl.trainer.checkpoint import CheckpointManager
from skyrl.trainer.trainer import RLTrainer


@dataclasses.dataclass
class Cfg:
    trainer: Any


class FakeTracker:
    def __init__(self, **kwargs):
        self.logged: list[int] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logged.append(step)

    def close(self, failed: bool = False) -> None:
        pass


def resumed_trainer(tmp_path, monkeypatch, saved_step: int, total_steps: int, export_hf=True):
    """A trainer of ``total_steps`` whose resume loads a checkpoint of ``saved_step``;
    ``ran`` records the steps it runs."""
    monkeypatch.setattr("skyrl.tracking.Tracker", FakeTracker)
    tr = RLTrainer.__new__(RLTrainer)
    t = SimpleNamespace(loggers=[], eval_before_train=False, export_hf=export_hf)
    tr.cfg, tr.output_dir, tr.total_steps = Cfg(t), tmp_path, total_steps
    tr.step, tr.policy_version, tr.history, tr._unpublished = 0, 0, [], None
    tr.checkpoints = CheckpointManager(tmp_path / "checkpoints", 0)  # the run's own: holds ckpt
    ckpt = tmp_path / "checkpoints" / f"global_step_{saved_step}"

    def resume() -> Path:
        tr.step = tr.policy_version = saved_step
        return ckpt

    tr.resume = resume
    tr.ran, tr.synced = [], []
    tr.run_step = lambda step: tr.ran.append(step) or {}
    tr.sync_weights = tr.synced.append
    tr.wait_for_engines = tr.check_nonfinite = lambda: None
    tr.rollouts = SimpleNamespace(has_eval=lambda: False)
    return tr, ckpt


@pytest.mark.parametrize("saved_step", [5, 7])
def test_a_resume_at_or_past_total_steps_says_there_is_nothing_to_train(
    tmp_path, monkeypatch, capsys, saved_step
):
    tr, ckpt = resumed_trainer(tmp_path, monkeypatch, saved_step, total_steps=5)
    tr.train()
    assert tr.ran == []
    assert capsys.readouterr().out.splitlines() == [
        f"checkpoint {ckpt} is at step {saved_step} and trainer.total_steps is 5: nothing to "
        "train (raise trainer.total_steps to continue); exporting its weights"
    ]


def test_without_export_the_line_does_not_promise_one(tmp_path, monkeypatch, capsys):
    tr, ckpt = resumed_trainer(tmp_path, monkeypatch, 5, total_steps=5, export_hf=False)
    tr.train()
    assert capsys.readouterr().out.splitlines() == [
        f"checkpoint {ckpt} is at step 5 and trainer.total_steps is 5: nothing to train "
        "(raise trainer.total_steps to continue)"
    ]


def test_a_resume_before_total_steps_runs_the_steps_left(tmp_path, monkeypatch, capsys):
    # checkpoint of step 3, total_steps 5: steps 4 and 5 run
    tr, ckpt = resumed_trainer(tmp_path, monkeypatch, 3, total_steps=5)
    tr.train()
    assert tr.ran == [4, 5] and tr.synced == [3]
    assert capsys.readouterr().out.splitlines() == [f"resumed from {ckpt} at step 3"]


def advantage_trainer(tmp_path) -> RLTrainer:
    """A GRPO trainer at step 3 whose driver is a user's factory, with no checkpoint yet."""
    from skyrl.config.algorithm import AlgorithmConfig

    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(
        algorithm=AlgorithmConfig(),
        generator=SimpleNamespace(step_wise=False, agent="my_pkg.driver.factory"),
    )
    tr.step, tr.checkpoints = 3, CheckpointManager(tmp_path / "checkpoints", 0)
    return tr


def group_batch(rewards: list[float]):
    """One prompt's group: a row per reward, 2 response tokens each."""
    import torch

    from skyrl.batch import TrainingInputBatch

    n = len(rewards)
    tensors = dict(rewards=torch.tensor(rewards, dtype=torch.float32), loss_mask=torch.ones(n, 2))
    ids = [f"p/{k}" for k in range(n)]
    return TrainingInputBatch(tensors, dict(uids=["p"] * n, trajectory_ids=ids, forks=[""] * n))


@pytest.mark.parametrize(
    ("bad", "shown"), [(float("nan"), "nan"), (float("inf"), "inf"), (1e39, "inf")]
)
def test_a_non_finite_reward_a_custom_driver_gives_is_one_line_naming_it(tmp_path, bad, shown):
    # 1e39 is finite in Python but past float32's 3.4e38: inf in the rows. Before, GRPO made
    # the whole group's advantages NaN and the steps were refused as a "non-finite loss".
    from skyrl.trainer.trainer import TrainingAborted

    with pytest.raises(TrainingAborted) as err:
        advantage_trainer(tmp_path).add_advantages(group_batch([1.0, bad, 0.0, 0.0]))
    assert str(err.value) == (
        f"step 3: trajectory 'p/1' has reward {shown} in the training rows (float32; 1 of 4 "
        "rows non-finite): generator.agent=my_pkg.driver.factory must give finite rewards "
        "within +-3.403e+38; no checkpoint was saved"
    )


def test_finite_rewards_give_the_grpo_advantages(tmp_path):
    # rewards [1, 0, 0, 0]: mean 0.25, unbiased std sqrt((0.75^2 + 3 x 0.25^2) / 3) = 0.5,
    # so the advantages are (1 - 0.25) / 0.5 = 1.5 and (0 - 0.25) / 0.5 = -0.5
    batch, _ = advantage_trainer(tmp_path).add_advantages(group_batch([1.0, 0.0, 0.0, 0.0]))
    assert batch.advantages[:, 0].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
