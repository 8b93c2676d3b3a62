"""A run stopped after its step's checkpoint was saved but before the step was logged (Ctrl-C
or SIGTERM in the step's eval: ``train`` publishes the checkpoint only after the record)
and resumed from that checkpoint (``trainer.resume=auto`` with no ``latest`` takes the
newest complete one): the step's eval never ran. At the last step the resume had nothing to
train, so the run ended with no final eval and no record of that step (``skyrl-train
experiment=smoke`` stopped in step 2's eval, then resumed: "steps run: 1", no eval line; a
sweep's objective, the last ``eval/pass@1``, NaN). The resumed run now evaluates that step
and logs it. Driven without Ray: the trainer is built with ``__new__``, its resume and
workers are stubs; the real ``Tracker`` writes ``metrics.jsonl``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from skyrl.tracking.summary import format_summary, read_history
from skyrl.trainer.checkpoint import CheckpointManager
from skyrl.trainer.trainer import RLTrainer


@dataclasses.dataclass
class Cfg:
    trainer: Any


def write_records(run_dir: Path, steps: list[int]) -> None:
    lines = [json.dumps({"step": s, "generate/reward_mean": s / 10}) + "\n" for s in steps]
    (run_dir / "metrics.jsonl").write_text("".join(lines))


def resumed_trainer(run_dir: Path, ckpt: Path, saved_step: int, total_steps: int,
                    eval_interval: int = 0) -> RLTrainer:  # fmt: skip
    """A trainer of ``total_steps`` whose resume loads ``ckpt`` (of ``saved_step``);
    ``ran`` records the steps it runs, ``evaluated`` the steps it evaluates at."""
    tr = RLTrainer.__new__(RLTrainer)
    t = SimpleNamespace(loggers=[], eval_before_train=False, export_hf=False,
                        eval_interval=eval_interval)  # fmt: skip
    tr.cfg, tr.output_dir, tr.total_steps = Cfg(t), run_dir, total_steps
    tr.step, tr.policy_version, tr.history, tr._unpublished = 0, 0, [], None
    tr.checkpoints = CheckpointManager(run_dir / "checkpoints", 0)
    tr.tracker = None

    def resume() -> Path:
        tr.step = tr.policy_version = saved_step
        return ckpt

    tr.resume = resume
    tr.ran, tr.evaluated = [], []
    tr.run_step = lambda step: tr.ran.append(step) or {"generate/reward_mean": step / 10}
    tr.sync_weights = lambda version: None
    tr.wait_for_engines = tr.check_nonfinite = lambda: None
    tr.rollouts = SimpleNamespace(has_eval=lambda: True)
    tr.evaluate = lambda: tr.evaluated.append(tr.step) or {"eval/pass@1": 0.75}
    return tr


def steps_in(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_history(run_dir)]


def test_the_last_step_stopped_in_its_eval_gets_its_eval_on_resume(tmp_path):
    write_records(tmp_path, [1])  # step 2's record was never written
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    tr = resumed_trainer(tmp_path, ckpt, saved_step=2, total_steps=2)
    tr.train()
    assert tr.ran == [] and tr.evaluated == [2]
    assert steps_in(tmp_path) == [1, 2]
    assert read_history(tmp_path)[-1] == {"step": 2, "eval/pass@1": 0.75}
    summary = format_summary(read_history(tmp_path), tmp_path)
    assert "steps run: 2" in summary  # was 1
    assert "eval/pass@1: 0.750 (step 2, the only eval)" in summary  # was no eval line


def test_a_step_already_logged_is_not_evaluated_again(tmp_path):
    # re-exporting latest (its record is there): nothing to evaluate, nothing to log
    write_records(tmp_path, [1, 2])
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    tr = resumed_trainer(tmp_path, ckpt, saved_step=2, total_steps=2)
    tr.train()
    assert tr.evaluated == [] and steps_in(tmp_path) == [1, 2]


def test_an_unlogged_middle_step_is_evaluated_when_its_eval_is_due(tmp_path):
    write_records(tmp_path, [1])
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    tr = resumed_trainer(tmp_path, ckpt, saved_step=2, total_steps=3, eval_interval=2)
    tr.train()
    assert tr.evaluated == [2] and tr.ran == [3]
    assert steps_in(tmp_path) == [1, 2, 3]


def test_an_unlogged_step_without_a_due_eval_logs_nothing(tmp_path):
    write_records(tmp_path, [1])
    ckpt = tmp_path / "checkpoints" / "global_step_2"
    tr = resumed_trainer(tmp_path, ckpt, saved_step=2, total_steps=3, eval_interval=0)
    tr.train()
    assert tr.evaluated == [] and tr.ran == [3]
    assert steps_in(tmp_path) == [1, 3]


def test_another_runs_checkpoint_is_not_evaluated_here(tmp_path):
    # its records are in its own run dir; this run's history starts after its step
    other = tmp_path / "a" / "checkpoints" / "global_step_2"
    run_dir = tmp_path / "b"
    run_dir.mkdir()
    tr = resumed_trainer(run_dir, other, saved_step=2, total_steps=2)
    tr.train()
    assert tr.evaluated == []
