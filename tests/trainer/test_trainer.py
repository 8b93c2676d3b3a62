"""``RLTrainer.run_step`` after training (weight sync, checkpoint, ``train/refused``) and the
adaptive KL controller's sample count, driven without Ray: the worker groups are fakes that
report scripted mini-batch records, the trainer is built with ``__new__``."""

from __future__ import annotations

import errno
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from skyrl.algorithms.kl_controllers import AdaptiveKLController
from skyrl.batch import TrainingInputBatch
from skyrl.config import ConfigError
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.tracking import metric_names as names
from skyrl.trainer.checkpoint import CheckpointManager
from skyrl.trainer.trainer import RLTrainer
from skyrl.workers.stats import LossSums, PackingStats, TrainStats

OK, NAN = False, True
"""A mini-batch's outcome: an optimizer step taken, or refused (non-finite)."""


class FakeGroup:
    """A worker group whose ``train_mini_batch`` reports the scripted outcome of each call."""

    compute_s = 0.0

    def __init__(self, outcomes: list[bool]):
        self.outcomes = list(outcomes)
        self.optimizer_steps = 0

    def train_mini_batch(self, chunks, logprobs_into=None) -> TrainStats:
        refused = self.outcomes.pop(0)
        self.optimizer_steps += not refused
        packing = PackingStats(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0)
        grad_norm = math.nan if refused else 1.0
        return TrainStats(LossSums(0.1, 3.0), grad_norm, 1e-3, refused, 0.0, packing)


def two_prompt_batch() -> TrainingInputBatch:
    """2 prompts x 2 samples, one row each: 2 mini-batches of 1 prompt per role."""
    lm = torch.zeros(4, 6)
    lm[:, 3:] = 1
    tensors = dict(
        input_ids=torch.ones(4, 6, dtype=torch.long), attention_mask=torch.ones(4, 6),
        loss_mask=lm, advantages=lm.clone(), returns=lm.clone(), values=0 * lm,
        old_logprobs=-lm,
    )  # fmt: skip
    return TrainingInputBatch(tensors, dict(uids=["a", "a", "b", "b"], is_last_step=[True] * 4))


def make_trainer(
    policy: list[bool],
    critic: list[bool] | None = None,
    critic_only_steps: int = 0,
    total_steps: int = 5,
    ckpt_interval: int = 1,
) -> RLTrainer:
    """A trainer of ``total_steps`` steps with a checkpoint every ``ckpt_interval`` (0: at the
    end); ``synced`` and ``saved`` record the versions it syncs and the steps it checkpoints."""
    tr = RLTrainer.__new__(RLTrainer)
    t = SimpleNamespace(
        policy_mini_batch_size=1, critic_mini_batch_size=1, train_batch_size=2,
        update_epochs_per_batch=1, critic_only_steps=critic_only_steps, dp_size=1,
        ckpt_interval=ckpt_interval, eval_interval=0,
    )  # fmt: skip
    tr.cfg = SimpleNamespace(
        trainer=t,
        generator=SimpleNamespace(step_wise=False, max_seq_len=6),
        algorithm=SimpleNamespace(loss_reduction="token_mean"),
    )
    tr.policy, tr.reference = FakeGroup(policy), None
    tr.critic = FakeGroup(critic) if critic is not None else None
    tr.reuse_training_logprobs = False
    tr.total_steps, tr.policy_version, tr.consecutive_nonfinite = total_steps, 0, 0
    tr.moved_since_checkpoint = False
    tr.rollouts = SimpleNamespace(
        next_batch=lambda step: (two_prompt_batch(), {}), has_eval=lambda: False
    )
    tr.add_logprobs_and_values = lambda batch, step: batch
    tr.add_advantages = lambda batch: (batch, {})
    tr.synced, tr.saved = [], []

    def sync_weights(version: int) -> None:
        tr.synced.append(version)
        tr.policy_version = version

    tr.sync_weights = sync_weights
    tr.save_checkpoint = lambda step, publish=True: tr.saved.append(step)
    return tr


def test_a_step_with_one_refused_mini_batch_syncs_and_checkpoints_what_moved():
    tr = make_trainer(policy=[NAN, OK])
    metrics = tr.run_step(1)
    assert tr.policy.optimizer_steps == 1 and metrics[names.POLICY.optimizer_steps] == 1.0
    assert tr.synced == [1] and tr.policy_version == 1  # the engines get the stepped weights
    assert tr.saved == [1]
    assert metrics[names.TRAIN_REFUSED] == 0.0  # the step's update went through, in part
    assert metrics[names.POLICY.nonfinite] == 1.0
    assert tr.consecutive_nonfinite == 1  # still a step that had a non-finite loss


def test_a_fully_refused_step_neither_syncs_nor_checkpoints():
    tr = make_trainer(policy=[NAN, NAN])
    metrics = tr.run_step(1)
    assert tr.synced == [] and tr.policy_version == 0
    assert tr.saved == []
    assert metrics[names.TRAIN_REFUSED] == 1.0
    assert tr.consecutive_nonfinite == 1


def test_a_refused_policy_with_a_stepped_critic_checkpoints_without_a_sync():
    tr = make_trainer(policy=[NAN, NAN], critic=[OK, OK])
    metrics = tr.run_step(1)
    assert tr.synced == [] and tr.policy_version == 0  # the policy's weights did not move
    assert tr.saved == [1]  # the critic's did
    assert metrics[names.TRAIN_REFUSED] == 0.0
    assert tr.consecutive_nonfinite == 1


def test_critic_only_steps_checkpoint_the_critic_and_sync_nothing():
    # steps 1 and 2: the critic's warm-up (2 mini-batches each); step 3: both roles train
    tr = make_trainer(policy=[OK, OK], critic=[OK] * 6, critic_only_steps=2)
    refused = [tr.run_step(step)[names.TRAIN_REFUSED] for step in (1, 2, 3)]
    assert tr.policy.optimizer_steps == 2 and tr.critic.optimizer_steps == 6
    assert tr.synced == [1] and tr.policy_version == 1  # one policy update: one version
    assert tr.saved == [1, 2, 3]
    assert refused == [0.0, 0.0, 0.0] and tr.consecutive_nonfinite == 0


def test_a_refused_critic_only_step_neither_syncs_nor_checkpoints():
    tr = make_trainer(policy=[], critic=[NAN, NAN], critic_only_steps=1)
    metrics = tr.run_step(1)
    assert tr.synced == [] and tr.saved == []
    assert metrics[names.TRAIN_REFUSED] == 1.0 and tr.consecutive_nonfinite == 1


class ForwardingGroup(FakeGroup):
    """A fake group with forwards: its no-grad forward gives every token logprob -2, its
    training forward -0.5 (written where the trainer asks for the training logprobs)."""

    def __init__(self, outcomes: list[bool]):
        super().__init__(outcomes)
        self.forwards = 0

    def forward(self, staged, num_rows: int, method: str = "forward") -> torch.Tensor:
        self.forwards += 1
        return torch.full((num_rows, 6), -2.0)

    def train_mini_batch(self, chunks, logprobs_into=None) -> TrainStats:
        if logprobs_into is not None:
            logprobs_into.fill_(-0.5)
        return super().train_mini_batch(chunks, logprobs_into)


def test_a_critic_run_takes_the_training_forwards_logprobs_once_its_warm_up_is_over(monkeypatch):
    # PPO with one critic-only step: step 1 trains the critic alone, so its old logprobs (read
    # by rollout/logprob_abs_diff) come from the separate forward, -2 on the loss tokens; step 2
    # trains the policy in one mini-batch per step: its old logprobs are the training
    # forward's, -0.5, and the policy runs no separate forward. The critic's values come from
    # its forward on both steps.
    tr = make_trainer(policy=[OK, OK], critic=[OK] * 4, critic_only_steps=1)
    tr.policy, tr.critic = ForwardingGroup([OK, OK]), ForwardingGroup([OK] * 4)
    tr.reuse_training_logprobs = True
    tr.cfg.algorithm = SimpleNamespace(loss_reduction="token_mean", uses_reference=False)
    del tr.add_logprobs_and_values  # the trainer's own
    seen = []
    monkeypatch.setattr(
        "skyrl.trainer.trainer.rollout_logprob_mismatch",
        lambda batch, version: seen.append(batch.old_logprobs.clone()) or {},
    )
    mask = two_prompt_batch().loss_mask
    tr.run_step(1)
    assert (tr.policy.forwards, tr.critic.forwards) == (1, 1)
    assert torch.equal(seen[0], -2.0 * mask)
    tr.run_step(2)
    assert (tr.policy.forwards, tr.critic.forwards) == (1, 2)
    assert torch.equal(seen[1], -0.5 * mask)
    assert tr.policy.optimizer_steps == 2 and tr.critic.optimizer_steps == 4


def saving_weights(tr: RLTrainer) -> RLTrainer:
    """``saved`` records (step, policy optimizer steps so far): which weights each holds."""
    tr.save_checkpoint = lambda step, publish=True: tr.saved.append(
        (step, tr.policy.optimizer_steps)
    )
    return tr


def test_a_refused_last_step_still_saves_what_earlier_steps_trained():
    # ckpt_interval=0 (only at the end): step 1 takes 2 optimizer steps, step 2 (the last) is
    # refused in full. The end-of-run checkpoint is step 2's, holding step 1's weights (2
    # optimizer steps); step 2's batch is spent, so a resume continues at step 3.
    tr = saving_weights(make_trainer(policy=[OK, OK, NAN, NAN], total_steps=2, ckpt_interval=0))
    refused = [tr.run_step(step)[names.TRAIN_REFUSED] for step in (1, 2)]
    assert refused == [0.0, 1.0]
    assert tr.saved == [(2, 2)]


def test_a_refused_cadence_step_saves_once_and_unmoved_weights_are_not_saved_again():
    # every 2nd step of 5: step 1 trains (2 optimizer steps), steps 2-5 are refused. Step 2
    # saves step 1's weights; steps 4 and 5 (the last) hold those same weights: no save.
    tr = saving_weights(make_trainer(policy=[OK, OK] + [NAN] * 8, total_steps=5, ckpt_interval=2))
    for step in range(1, 6):
        tr.run_step(step)
    assert tr.saved == [(2, 2)]


def test_a_resumed_run_that_trains_nothing_saves_nothing():
    # the checkpoint it loaded holds its weights (moved_since_checkpoint starts False): a
    # refused last step has nothing new to save
    tr = saving_weights(make_trainer(policy=[NAN, NAN], total_steps=4, ckpt_interval=0))
    tr.run_step(4)  # resumed from step 3's checkpoint
    assert tr.saved == []


class FakeWorkers:
    def __init__(self):
        self.calls = []

    def run(self, method: str, *args) -> list:
        self.calls.append((method, *args))
        return [None]


def test_a_rewound_resume_points_latest_at_its_checkpoint_before_logging(tmp_path):
    # run A published steps 2 and 4; run B resumes from step 2, and its tracker then drops the
    # metrics records of steps 3 and 4. `latest` still naming A's step 4 made a kill anywhere
    # in B's step 3 or 4 resume from a checkpoint whose records are gone (or, once B had
    # re-saved step 4 unpublished, from one with no record at all).
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    for step in (2, 4):
        tmp = manager.temp_dir(step)
        manager.commit(tmp, step, {"step": step, "kl_coef": 0.1})
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(
        trainer=SimpleNamespace(resume=str(manager.root / "global_step_2"), zero_stage=0)
    )
    tr.checkpoints, tr.policy, tr.critic = manager, FakeWorkers(), None
    tr.rollouts = SimpleNamespace(load_state_dict=lambda state: None)
    tr.kl_ctrl = SimpleNamespace(value=0.0)
    assert tr.resume() == manager.root / "global_step_2"
    assert tr.policy.calls == [("load_checkpoint", str(manager.root / "global_step_2"))]
    assert tr.step == 2 and manager.latest() == manager.root / "global_step_2"


class ResumedWorkers(FakeWorkers):
    """Workers whose ``load_checkpoint`` put the config's lr and weight decay over the saved."""

    def run(self, method: str, *args) -> list:
        super().run(method, *args)
        changed = {
            "trainer.policy_optimizer.lr": (1e-06, 1e-05),
            "trainer.policy_optimizer.weight_decay": (0.0, 0.1),
        }
        return [changed, changed]


def test_a_resume_says_which_saved_optimizer_settings_the_config_replaced(tmp_path, capsys):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    manager.commit(manager.temp_dir(2), 2, {"step": 2, "kl_coef": 0.1})
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(trainer=SimpleNamespace(resume="auto", zero_stage=0))
    tr.checkpoints, tr.policy, tr.critic = manager, ResumedWorkers(), None
    tr.rollouts = SimpleNamespace(load_state_dict=lambda state: None)
    tr.kl_ctrl = SimpleNamespace(value=0.0)
    assert tr.resume() == manager.root / "global_step_2"
    assert capsys.readouterr().out == (
        "resumed with the config's optimizer settings over the saved: "
        "trainer.policy_optimizer.lr 1e-06 -> 1e-05, "
        "trainer.policy_optimizer.weight_decay 0.0 -> 0.1\n"
    )


class DamagedWorkers:
    """A worker group whose ``load_checkpoint`` fails as ``WorkerGroup.run`` reports it."""

    def __init__(self, reason: str):
        self.reason = reason

    def run(self, method: str, *args) -> list:
        raise RuntimeError(f"policy worker failed: {self.reason}")


@pytest.mark.parametrize(
    "reason",
    [
        # a truncated mp_rank_00_model_states.pt (torch.load's message, first line)
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
        "directory",
        # saved at trainer.zero_stage=0, resumed at 2: DeepSpeed looks for the ZeRO partition
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'global_step_1/policy/state/zero_pp_rank_0_mp_rank_00_optim_states.pt'",
    ],
)
def test_a_checkpoint_the_workers_cannot_load_is_one_line_naming_it(tmp_path, reason):
    # Before, the workers' RuntimeError reached the CLI as a 74-line traceback that named
    # neither trainer.resume nor the checkpoint; nothing on disk may change either way.
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    manager.commit(manager.temp_dir(1), 1, {"step": 1, "kl_coef": 0.1})
    ckpt = manager.root / "global_step_1"
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(trainer=SimpleNamespace(resume="auto", zero_stage=0))
    tr.checkpoints, tr.policy, tr.critic = manager, DamagedWorkers(reason), None
    with pytest.raises(ConfigError) as err:
        tr.resume()
    assert err.value.key == "trainer.resume"
    assert err.value.message == (
        f"{ckpt} could not be loaded (policy worker failed: {reason}): resume it with the "
        "model.path, trainer.zero_stage and model.lora it was saved with, or from another "
        "checkpoint"
    )
    assert manager.latest() == ckpt and manager.steps() == [1]


@pytest.mark.parametrize(("saved", "stage", "refused"), [(0, 2, True), (3, 1, True), (1, 2, False)])
def test_a_checkpoint_resumes_only_at_a_zero_stage_of_its_file_layout(
    tmp_path, saved, stage, refused
):
    # saved at stage 0, resumed at 2: a traceback from the workers, which DeepSpeed ended in
    # FileNotFoundError: ...zero_pp_rank_0_mp_rank_00_optim_states.pt (2 -> 0: AttributeError:
    # 'NoneType' object has no attribute 'copy'), naming neither key nor saved stage
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    manager.commit(manager.temp_dir(1), 1, {"step": 1, "kl_coef": 0.1, "zero_stage": saved})
    ckpt = manager.root / "global_step_1"
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(trainer=SimpleNamespace(resume="auto", zero_stage=stage))
    tr.checkpoints, tr.policy, tr.critic = manager, FakeWorkers(), None
    tr.rollouts = SimpleNamespace(load_state_dict=lambda state: None)
    tr.kl_ctrl = SimpleNamespace(value=0.0)
    if not refused:  # ZeRO 1 and 2 write the same files
        assert tr.resume() == ckpt
        return
    with pytest.raises(ConfigError) as err:
        tr.resume()
    assert err.value.key == "trainer.zero_stage"
    assert err.value.message == (
        f"{ckpt} was saved at trainer.zero_stage={saved}, but trainer.zero_stage={stage}: "
        f"DeepSpeed resumes it only at a stage of the same file layout (set "
        f"trainer.zero_stage={saved})"
    )
    assert tr.policy.calls == []  # refused before the workers load anything


def test_a_checkpoint_file_cut_short_is_refused_before_the_workers_load_it(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    tmp = manager.temp_dir(1)
    (tmp / "policy").mkdir()
    (tmp / "policy" / "rng_rank0.pt").write_bytes(b"12345678")
    manager.commit(tmp, 1, {"step": 1, "kl_coef": 0.1, "zero_stage": 0})
    ckpt = manager.root / "global_step_1"
    (ckpt / "policy" / "rng_rank0.pt").write_bytes(b"1234")  # a copy that stopped midway
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(trainer=SimpleNamespace(resume="auto", zero_stage=0))
    tr.checkpoints, tr.policy, tr.critic = manager, FakeWorkers(), None
    with pytest.raises(ConfigError) as err:
        tr.resume()
    assert err.value.key == "trainer.resume"
    assert err.value.message == (
        f"{ckpt / 'policy' / 'rng_rank0.pt'} has 4 bytes, but was saved with 8: {ckpt} is damaged"
    )
    assert tr.policy.calls == []


def turns_batch(num_turns: int) -> TrainingInputBatch:
    """2 prompts x 2 samples = 4 trajectories of ``num_turns`` step-wise rows each; 3 loss
    tokens per row at old logprob -1.0 and reference logprob -1.5."""
    uids, trajectory_ids, is_last_step = [], [], []
    for p in range(2):
        for s in range(2):
            for turn in range(num_turns):
                uids.append(f"p{p}")
                trajectory_ids.append(f"p{p}/{s}")
                is_last_step.append(turn == num_turns - 1)
    rows = len(uids)
    lm = torch.zeros(rows, 6)
    lm[:, 3:] = 1
    rewards = torch.tensor([1.0 if last and i % 2 else 0.0 for i, last in enumerate(is_last_step)])
    tensors = dict(
        input_ids=torch.ones(rows, 6, dtype=torch.long), attention_mask=torch.ones(rows, 6),
        loss_mask=lm, old_logprobs=-1.0 * lm, ref_logprobs=-1.5 * lm, rewards=rewards,
    )  # fmt: skip
    metadata = dict(uids=uids, trajectory_ids=trajectory_ids, is_last_step=is_last_step)
    return TrainingInputBatch(tensors, metadata)


@pytest.mark.parametrize("num_turns", [1, 5])
def test_the_adaptive_kl_controller_counts_trajectories_not_turns(num_turns):
    a = AlgorithmConfig(
        advantage_estimator="grpo", use_kl_in_reward=True, kl_ctrl="adaptive",
        init_kl_coef=0.1, kl_target=0.01, kl_horizon=100, kl_estimator="k1",
    )  # fmt: skip
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(algorithm=a, generator=SimpleNamespace(step_wise=True))
    tr.kl_ctrl = AdaptiveKLController(a.init_kl_coef, a.kl_target, a.kl_horizon)
    _, metrics = tr.add_advantages(turns_batch(num_turns))
    # k1 per token = old - ref = -1.0 - (-1.5) = 0.5 on every loss token, so mean KL 0.5;
    # error = clip(0.5 / 0.01 - 1, -0.2, 0.2) = 0.2; 4 trajectories whatever the turns:
    # 0.1 * (1 + 0.2 * 4 / 100) = 0.1008 (counting 20 rows of 5 turns gave 0.104)
    assert metrics["algorithm/kl_in_reward"] == pytest.approx(0.5, abs=1e-12)
    assert tr.kl_ctrl.value == pytest.approx(0.1008, abs=1e-12)


def test_critic_only_steps_past_the_runs_steps_are_refused_before_any_worker_starts(
    monkeypatch, tmp_path
):
    import skyrl
    from skyrl.config.errors import ConfigError
    from skyrl.config.validate import validate
    from skyrl.trainer import trainer as trainer_module

    cfg = validate(
        skyrl.compose([
            "experiment=smoke", "algorithm=ppo", "data.source=files",
            "data.train_files=[train.jsonl]", "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=1", "trainer.critic_mini_batch_size=1",
            "trainer.total_steps=null", "trainer.epochs=2", "trainer.critic_only_steps=6",
        ])
    )  # fmt: skip
    # the prompts loaded: 6 // train_batch_size 2 = 3 batches x epochs 2 = 6 steps
    closed: list[bool] = []
    rollouts = SimpleNamespace(engine=None, batches_per_epoch=3, close=lambda: closed.append(True))
    monkeypatch.setattr(trainer_module, "make_rollouts", lambda *a, **k: rollouts)
    monkeypatch.setattr(trainer_module, "with_local_model_paths", lambda cfg: cfg)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(
        "skyrl.workers.group.WorkerGroup", lambda *a, **k: pytest.fail("a worker group started")
    )
    with pytest.raises(ConfigError) as err:
        RLTrainer(cfg, tmp_path)
    assert (err.value.key, err.value.message) == (
        "trainer.critic_only_steps",
        "the policy would never train: 6 critic-only steps of 6",
    )
    assert closed == [True]  # the rollout source (its engines, if any) is stopped


def test_the_export_records_the_step_whose_weights_it_holds(tmp_path):
    # a run exported at step 2, then resumed to step 3 and stopped before exporting again,
    # left a final_hf that `skyrl-eval eval.checkpoint=<run>` took for the run's latest weights
    import json

    from skyrl.trainer.checkpoint import EXPORT_RECORD, exported_step

    final_hf, partial = tmp_path / "final_hf", tmp_path / "final_hf.partial"

    class Exporting(FakeWorkers):
        def run(self, method: str, *args) -> list:
            Path(args[0]).mkdir()  # the worker writes a new folder beside the earlier export
            (Path(args[0]) / "config.json").write_text("{}")
            return super().run(method, *args)

    tr = RLTrainer.__new__(RLTrainer)
    tr.output_dir, tr.policy = tmp_path, Exporting()
    tr.cfg = SimpleNamespace(model=SimpleNamespace(lora=SimpleNamespace(enabled=False),
                                                   tokenizer_path="tok"))  # fmt: skip
    for step in (2, 3):
        tr.step = step
        assert tr.export() == final_hf
        assert json.loads((final_hf / EXPORT_RECORD).read_text()) == {"step": step}
        assert exported_step(final_hf) == step
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_hf"]
    assert tr.policy.calls == [("export_hf", str(partial), "tok", None)] * 2


def test_an_export_that_fails_leaves_the_earlier_export_as_it_was(tmp_path):
    # the export wrote over final_hf in place: one that failed half-way (a full disk) left
    # the earlier, complete export of step 2 half overwritten
    from skyrl.trainer.checkpoint import exported_step, write_export_record
    from skyrl.trainer.trainer import TrainingAborted

    final_hf = tmp_path / "final_hf"
    final_hf.mkdir()
    (final_hf / "model.safetensors").write_bytes(b"step 2 weights")
    write_export_record(final_hf, 2)

    class HalfWritten(FakeWorkers):
        def run(self, method: str, *args) -> list:
            Path(args[0]).mkdir()
            (Path(args[0]) / "model.safetensors").write_bytes(b"step 3 wei")
            raise RuntimeError("policy worker failed: OSError: [Errno 28] No space left on device")

    tr = exporting_trainer(tmp_path, HalfWritten())
    with pytest.raises(TrainingAborted, match="No space left on device$"):
        tr.export()
    assert (final_hf / "model.safetensors").read_bytes() == b"step 2 weights"
    assert exported_step(final_hf) == 2  # skyrl-eval of the run then takes step 3's checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "final_hf"]


class Component:
    """A rollout source, worker group, engine or shared-memory file whose stop is recorded,
    or raises ``fails`` after recording it."""

    def __init__(self, name: str, stopped: list[str], fails: BaseException | None = None):
        self.name, self.stopped, self.fails = name, stopped, fails

    def shutdown(self) -> None:
        self.stopped.append(self.name)
        if self.fails is not None:
            raise self.fails

    close = shutdown


def test_shutdown_stops_every_component_when_some_fail(caplog):
    # The rollout source's close timed out (TimeoutError, as an async run's did) and the
    # reference group's shutdown raised: shutdown raised the first error, the rest never
    # stopped (workers, engine and shared memory left running) and skyrl.train's finally
    # replaced the run's result with it. Now each is stopped, each failure logged as one line.
    import logging

    stopped: list[str] = []
    tr = RLTrainer.__new__(RLTrainer)
    tr.rollouts = Component("rollouts", stopped, TimeoutError())
    tr.critic = Component("critic", stopped)
    tr.reference = Component("reference", stopped, RuntimeError("actor died"))
    tr.policy = Component("policy", stopped)
    tr.engine = Component("engine", stopped)
    tr.engine_sync = Component("engine_sync", stopped)
    with caplog.at_level(logging.ERROR, logger="skyrl.trainer.trainer"):
        tr.shutdown()
    assert stopped == ["rollouts", "critic", "reference", "policy", "engine", "engine_sync"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "rollout source" in lines[0] and "TimeoutError" in lines[0]
    assert "reference" in lines[1] and "RuntimeError: actor died" in lines[1]
    assert all("\n" not in line for line in lines)


def test_shutdown_skips_the_components_a_run_does_not_have():
    stopped: list[str] = []
    tr = RLTrainer.__new__(RLTrainer)
    tr.rollouts, tr.policy = Component("rollouts", stopped), Component("policy", stopped)
    tr.critic = tr.reference = tr.engine = tr.engine_sync = None  # data=fake, no critic
    tr.shutdown()
    assert stopped == ["rollouts", "policy"]


class FailingSave(FakeWorkers):
    """A worker group whose ``save_checkpoint`` raises ``error`` after writing a part."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    def run(self, method: str, *args) -> list:
        super().run(method, *args)
        from pathlib import Path

        (Path(args[0]) / "policy").mkdir()  # the part written before the disk filled up
        raise self.error


def saving_trainer(tmp_path, policy) -> RLTrainer:
    """A trainer whose step 1 is checkpointed and published, with ``policy`` as its group."""
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    manager.commit(manager.temp_dir(1), 1, {"step": 1})
    tr = RLTrainer.__new__(RLTrainer)
    tr.checkpoints, tr.policy, tr.critic = manager, policy, None
    tr.rollouts = SimpleNamespace(state_dict=lambda: {})
    tr.policy_version, tr.consecutive_nonfinite = 1, 0
    tr.kl_ctrl = SimpleNamespace(value=0.0)
    return tr


def test_a_save_that_fails_on_a_full_disk_says_where_and_what_resumes(tmp_path, monkeypatch):
    # A full disk at step 3's save ended the run with a traceback and "RuntimeError: policy
    # worker failed: [enforce fail at inline_container.cc:672] . unexpected pos ...", naming
    # neither the step, the dir, the free space nor the checkpoint a resume would use.
    import shutil

    from skyrl.trainer.trainer import TrainingAborted

    reason = "policy worker failed: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 8"
    tr = saving_trainer(tmp_path, FailingSave(RuntimeError(reason + "\nmore lines")))
    usage = shutil._ntuple_diskusage(total=8 << 20, used=(8 << 20) - 111_411, free=111_411)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    with pytest.raises(TrainingAborted) as err:
        tr.save_checkpoint(3, publish=False)
    root = tmp_path / "checkpoints"
    # 111_411 bytes / 2**20 = 0.106 MiB -> "0.1 MiB"
    assert str(err.value) == (
        f"saving the checkpoint of step 3 into {root} failed (0.1 MiB free there); last "
        f"checkpoint: {root / 'global_step_1'} (trainer.resume=auto continues from it); {reason}"
    )
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "latest"]  # part removed


def test_a_save_into_a_read_only_dir_names_the_os_reason(tmp_path, monkeypatch):
    import shutil

    from skyrl.trainer.trainer import TrainingAborted

    tr = saving_trainer(tmp_path, FakeWorkers())
    root = tmp_path / "checkpoints"

    def read_only(step: int):
        raise OSError(30, "Read-only file system", str(root / f".tmp_global_step_{step}"))

    monkeypatch.setattr(tr.checkpoints, "temp_dir", read_only)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(0, 0, 3 << 30))
    with pytest.raises(TrainingAborted) as err:
        tr.save_checkpoint(2)
    assert str(err.value).endswith(
        f"(3.0 GiB free there); last checkpoint: {root / 'global_step_1'} (trainer.resume=auto "
        f"continues from it); [Errno 30] Read-only file system: '{root}/.tmp_global_step_2'"
    )
    assert tr.policy.calls == []


def test_a_worker_that_dies_while_saving_is_reported_as_such(tmp_path):
    from skyrl.workers.group import WorkerDiedError

    died = WorkerDiedError("policy worker rank 0 died: killed")
    tr = saving_trainer(tmp_path, FailingSave(died))
    with pytest.raises(WorkerDiedError) as err:
        tr.save_checkpoint(2)
    assert err.value is died


def test_a_trainer_whose_critic_fails_to_start_stops_what_it_started(monkeypatch, tmp_path):
    # skyrl.train builds the trainer before its try/finally and __init__ cleaned up nothing: a
    # critic that failed to start (out of memory) left the policy's actors and placement group
    # alive (and the engines), holding 2 of the caller's Ray CPUs until the process ended.
    import skyrl
    from skyrl.config.validate import validate
    from skyrl.trainer import trainer as trainer_module
    from skyrl.workers.group import WorkerDiedError

    cfg = validate(skyrl.compose(["experiment=smoke", "algorithm=ppo"]))  # reference + critic
    stopped: list[str] = []
    engine = Component("engine", stopped)
    rollouts = SimpleNamespace(
        engine=engine, batches_per_epoch=4, close=lambda: stopped.append("rollouts")
    )
    died = WorkerDiedError("critic worker rank 0 failed to start: MemoryError: simulated")

    def start_group(role: str, *args):
        if role == "critic":
            raise died
        return Component(role, stopped)

    monkeypatch.setattr(trainer_module, "make_rollouts", lambda *a, **k: rollouts)
    monkeypatch.setattr(trainer_module, "with_local_model_paths", lambda cfg: cfg)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr("skyrl.workers.group.WorkerGroup", start_group)
    with pytest.raises(WorkerDiedError) as err:
        RLTrainer(cfg, tmp_path)
    assert err.value is died  # the start's own error, after the cleanup
    # shutdown's order; the critic never started, the shared-memory file was not made yet
    assert stopped == ["rollouts", "reference", "policy", "engine"]


def test_an_interrupt_while_the_trainer_starts_stops_what_it_started(monkeypatch, tmp_path):
    import skyrl
    from skyrl.config.validate import validate
    from skyrl.trainer import trainer as trainer_module

    cfg = validate(skyrl.compose(["experiment=smoke"]))
    stopped: list[str] = []
    rollouts = SimpleNamespace(
        engine=None, batches_per_epoch=4, close=lambda: stopped.append("rollouts")
    )
    monkeypatch.setattr(trainer_module, "make_rollouts", lambda *a, **k: rollouts)
    monkeypatch.setattr(trainer_module, "with_local_model_paths", lambda cfg: cfg)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)

    def start_group(role: str, *args):
        return Component(role, stopped)

    monkeypatch.setattr("skyrl.workers.group.WorkerGroup", start_group)

    def interrupted(self):
        raise KeyboardInterrupt  # Ctrl-C while asking the policy about dropout

    monkeypatch.setattr(RLTrainer, "_decide_old_logprobs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RLTrainer(cfg, tmp_path)
    assert stopped == ["rollouts", "policy"]


class FailingExport(FakeWorkers):
    """A worker group whose ``export_hf`` raises ``error``."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    def run(self, method: str, *args) -> list:
        super().run(method, *args)
        raise self.error


def exporting_trainer(tmp_path, policy) -> RLTrainer:
    """A trainer at step 3 of a run whose step 3 is checkpointed, with ``policy`` as its group."""
    tr = saving_trainer(tmp_path, policy)
    tr.checkpoints.commit(tr.checkpoints.temp_dir(3), 3, {"step": 3})
    tr.output_dir, tr.step = tmp_path, 3
    tr.cfg = SimpleNamespace(model=SimpleNamespace(lora=SimpleNamespace(enabled=False),
                                                   tokenizer_path="tok"))  # fmt: skip
    return tr


def test_an_export_that_fails_says_where_and_that_the_trained_weights_are_saved(
    tmp_path, monkeypatch
):
    # A final_hf the policy could not write (here its model.safetensors a directory; a full
    # disk alike) ended a finished run with a 50-line traceback ending "RuntimeError: policy
    # worker failed: SafetensorError: ...", naming neither final_hf nor the checkpoint that
    # holds the trained weights, nor how to export them.
    import shutil

    from skyrl.trainer.trainer import TrainingAborted

    reason = (
        "policy worker failed: SafetensorError: Error while serializing: I/O error: "
        "Is a directory (os error 21)"
    )
    tr = exporting_trainer(tmp_path, FailingExport(RuntimeError(reason + "\nmore lines")))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(0, 0, 3 << 30))
    with pytest.raises(TrainingAborted) as err:
        tr.export()
    ckpt = tmp_path / "checkpoints" / "global_step_3"
    assert str(err.value) == (  # 3 << 30 bytes = 3.0 GiB
        f"exporting the policy of step 3 into {tmp_path / 'final_hf'} failed (3.0 GiB free "
        f"there); the trained weights are in the last checkpoint: {ckpt} (re-running with "
        f"trainer.resume=auto exports it again); {reason}"
    )


def test_a_worker_that_dies_while_exporting_is_reported_as_such(tmp_path):
    from skyrl.workers.group import WorkerDiedError

    died = WorkerDiedError("policy worker rank 0 died: killed")
    tr = exporting_trainer(tmp_path, FailingExport(died))
    with pytest.raises(WorkerDiedError) as err:
        tr.export()
    assert err.value is died


class FullDiskTracker:
    """A tracker whose metrics file cannot take another line (ENOSPC), nor close."""

    def log(self, step, metrics):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self, failed=False):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_metrics_that_cannot_be_written_end_the_run_in_one_line(tmp_path, monkeypatch):
    from skyrl.trainer import trainer as trainer_module
    from skyrl.trainer.trainer import TrainingAborted

    # a full disk while the step's metrics record was written was an OSError traceback
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    manager.commit(manager.temp_dir(2), 2, {"step": 2, "kl_coef": 0.1})
    tr = RLTrainer.__new__(RLTrainer)
    tr.checkpoints, tr.output_dir, tr.history = manager, tmp_path, []
    tr.tracker = FullDiskTracker()
    monkeypatch.setattr(trainer_module, "free_space", lambda path: "0.0 MiB")
    with pytest.raises(TrainingAborted) as err:
        tr.log(3, {"reward": 1.0})
    assert str(err.value) == (
        f"writing the metrics of step 3 into {tmp_path} failed (0.0 MiB free there); last "
        f"checkpoint: {manager.root / 'global_step_2'} (trainer.resume=auto continues from it); "
        "[Errno 28] No space left on device"
    )


def test_a_tracker_that_fails_to_close_does_not_hide_the_runs_error(monkeypatch, tmp_path, capsys):
    # the full disk that stopped the metrics also fails the trackers' close: that OSError
    # replaced the run's one-line error with a traceback
    import skyrl.tracking
    from skyrl.trainer import trainer as trainer_module
    from skyrl.trainer.trainer import TrainingAborted

    monkeypatch.setattr(skyrl.tracking, "Tracker", lambda **kwargs: FullDiskTracker())
    manager = CheckpointManager(tmp_path / "checkpoints", max_to_keep=0)
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(trainer=SimpleNamespace(loggers=[], eval_before_train=False))
    tr.checkpoints, tr.output_dir, tr.history, tr.step, tr.total_steps = manager, tmp_path, [], 0, 2
    tr.resume = lambda: None
    tr.run_step = lambda step: {"reward": 1.0}
    monkeypatch.setattr(trainer_module, "dataclasses", SimpleNamespace(asdict=lambda cfg: {}))
    with pytest.raises(TrainingAborted, match="^writing the metrics of step 1 into"):
        tr.train()
    assert capsys.readouterr().err == (
        "warning: closing the trackers failed too: [Errno 28] No space left on device\n"
    )
