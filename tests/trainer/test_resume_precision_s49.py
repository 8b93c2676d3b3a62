"""A checkpoint resumed in another ``trainer.precision`` (``auto`` picks bf16 on an AMX CPU or a
GPU and fp32 elsewhere, so moving a run between machines changes it). A bf16 checkpoint at
ZeRO 0, resumed in fp32, started the workers and then ended in "policy worker rank 1 failed:
KeyError: 'param_groups' ... resume it with the model.path, trainer.zero_stage and model.lora
it was saved with", naming none of what differed; at ZeRO 1 and 2 bf16 writes
``bf16_zero_pp_rank_*`` files where fp32 looks for ``zero_pp_rank_*`` (FileNotFoundError). The
trainer state now records the precision, and the pre-flight refuses another one, naming
``trainer.precision``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import skyrl
from skyrl.config import ConfigError
from skyrl.trainer.checkpoint import CheckpointManager, check_resumable
from skyrl.trainer.trainer import RLTrainer


def _checkpoint(run: Path, state: dict) -> Path:
    """A complete checkpoint of the smoke experiment's 2 ranks at step 2, and ``latest``."""
    ckpt = run / "checkpoints" / "global_step_2"
    (ckpt / "policy").mkdir(parents=True)
    for rank in range(2):
        (ckpt / "policy" / f"rng_rank{rank}.pt").write_bytes(b"")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2, "kl_coef": 0.0, **state}))
    (run / "checkpoints" / "latest").write_text("global_step_2\n")
    return ckpt


def _dry_run(out: Path, *overrides: str):
    cfg = skyrl.compose(["experiment=smoke", "trainer.dry_run=true", *overrides])
    return skyrl.train(cfg, output_dir=out)


def test_a_bf16_checkpoint_resumed_in_fp32_is_refused_before_the_run(tmp_path):
    run = tmp_path / "run"
    ckpt = _checkpoint(run, {"zero_stage": 0, "precision": "bf16"})
    with pytest.raises(ConfigError) as err:
        _dry_run(run, "trainer.precision=fp32")
    assert err.value.key == "trainer.precision"
    assert err.value.message == (
        f"{ckpt} was saved in trainer.precision=bf16, but this run trains in fp32: DeepSpeed "
        "resumes it only in the precision it was saved in (set trainer.precision=bf16)"
    )
    assert _dry_run(run, "trainer.precision=bf16") is not None


@pytest.mark.parametrize(
    ("saved", "now", "refused"),
    [
        # (stage, precision) saved -> resumed
        ((0, "bf16"), (0, "fp32"), "trainer.precision"),
        ((0, "fp32"), (0, "bf16"), "trainer.precision"),
        ((1, "bf16"), (1, "fp32"), "trainer.precision"),
        ((2, "bf16"), (1, "bf16"), None),  # bf16_zero_pp_rank_* at both stages
        ((3, "fp32"), (3, "fp32"), None),
        ((0, "fp32"), (2, "fp32"), "trainer.zero_stage"),
    ],
)
def test_a_checkpoint_resumes_at_its_stage_layout_in_its_precision(tmp_path, saved, now, refused):
    ckpt = tmp_path / "global_step_2"
    ckpt.mkdir()
    state = {"zero_stage": saved[0], "precision": saved[1]}
    if refused is None:
        check_resumable(ckpt, state, *now)
        return
    with pytest.raises(ConfigError) as err:
        check_resumable(ckpt, state, *now)
    assert err.value.key == refused


def test_both_a_precision_and_a_stage_layout_that_differ_are_named(tmp_path):
    ckpt = tmp_path / "global_step_2"
    ckpt.mkdir()
    with pytest.raises(ConfigError) as err:
        check_resumable(ckpt, {"zero_stage": 0, "precision": "bf16"}, 3, "fp32")
    assert err.value.message.endswith("(set trainer.precision=bf16 trainer.zero_stage=0)")


def test_a_checkpoint_saved_before_the_precision_record_is_compared_by_stage_only(tmp_path):
    ckpt = tmp_path / "global_step_2"
    ckpt.mkdir()
    check_resumable(ckpt, {"zero_stage": 0}, 0, "bf16")
    with pytest.raises(ConfigError) as err:
        check_resumable(ckpt, {"zero_stage": 0}, 3, "bf16")
    assert err.value.key == "trainer.zero_stage"


class _SavingWorkers:
    def run(self, method: str, *args) -> list:
        return [None]


def test_the_trainer_records_the_precision_it_saved_in(tmp_path):
    tr = RLTrainer.__new__(RLTrainer)
    trainer = SimpleNamespace(resume="auto", zero_stage=1, precision="bf16")
    tr.cfg = SimpleNamespace(
        trainer=trainer,
        model=SimpleNamespace(lora=SimpleNamespace(enabled=False)),
        algorithm=SimpleNamespace(uses_reference=False),
    )
    tr.checkpoints = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    tr.policy, tr.critic = _SavingWorkers(), None
    tr.rollouts = SimpleNamespace(state_dict=lambda: {})
    tr.kl_ctrl = SimpleNamespace(value=0.0)
    tr.policy_version, tr.consecutive_nonfinite = 2, 0
    saved = tr.save_checkpoint(2)
    state = json.loads((saved / "trainer_state.json").read_text())
    assert (state["zero_stage"], state["precision"]) == (1, "bf16")
