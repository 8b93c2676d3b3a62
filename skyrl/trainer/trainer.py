"""The RL loop: rollouts, logprobs, advantages, train, checkpoint, sync, eval, log.

``RLTrainer.train`` reads like the algorithm; each stage is one method. The
mini-batches of a step are cut in PROMPT units, so a step always takes
``train_batch_size / policy_mini_batch_size * update_epochs_per_batch``
optimizer steps, whatever the number of turns.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from skyrl.algorithms import compute_advantages, compute_loss_weights
from skyrl.algorithms.advantages import AdvantageInputs
from skyrl.algorithms.advantages.step_wise import broadcast_last_step_advantages
from skyrl.algorithms.kl import masked_kl
from skyrl.algorithms.kl_controllers import build_kl_controller
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.config.errors import ConfigError
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import check_critic_only_steps, resolve_precision
from skyrl.dispatch import MeshDispatch
from skyrl.generators.agent_loop import REWARD_MAX
from skyrl.inference.client import EngineClient
from skyrl.models.resolve import with_local_model_paths
from skyrl.rollouts import RolloutSource, WeightSyncTimeout, make_rollouts
from skyrl.tracking import metric_names as names
from skyrl.trainer.checkpoint import (
    REFERENCE_FINGERPRINT,
    CheckpointManager,
    check_resumable,
    free_space,
    read_trainer_state,
    resolve_resume,
    set_aside_abandoned_export,
    write_export_record,
)
from skyrl.trainer.on_policy import describe, reuses_on_step, separate_forward_reason
from skyrl.trainer.plan import (
    has_reference_workers,
    make_plan,
    optimizer_steps,
    short_warm_ups,
)
from skyrl.trainer.step_stats import step_metrics
from skyrl.trainer.weight_sync import EngineSync, SyncTimedOut
from skyrl.workers.worker import OLD_LOGPROBS_FROM_TRAINING

if TYPE_CHECKING:
    from skyrl.data import PromptSplits
    from skyrl.tracking import Tracker
    from skyrl.workers.stats import TrainStats

PHASES = ("generate", "forward", "train", "checkpoint", "sync", "eval")
"""Timed phases of a step (``timing/<phase>_s``)."""


class TrainingAborted(RuntimeError):
    """The run stopped on purpose (too many consecutive non-finite steps, a weight sync that
    timed out); the message is one line for the user."""


class WeightSyncTimedOut(TrainingAborted):
    """A weight sync did not finish within ``trainer.weight_sync_timeout_s``."""


class RLTrainer:
    """Owns the engine, the rollout source and the worker groups of one run."""

    def __init__(self, cfg: SkyRLConfig, output_dir: Path, prompts: PromptSplits | None = None):
        """``prompts``: rows the pre-flight check already loaded and checked (``skyrl.train``
        passes them); None = the rollout source loads them itself."""
        from transformers import AutoTokenizer

        from skyrl.workers.group import WorkerGroup

        self.cfg = with_local_model_paths(cfg)  # workers and engines see local directories only
        cfg, t = self.cfg, self.cfg.trainer
        self.output_dir = Path(output_dir)
        self.plan = make_plan(cfg)
        self.tokenizer = AutoTokenizer.from_pretrained(
            cfg.model.tokenizer_path, trust_remote_code=cfg.model.trust_remote_code
        )
        self.rollouts: RolloutSource = make_rollouts(
            cfg, self.tokenizer, self.output_dir, prompts=prompts
        )
        self.engine: EngineClient | None = self.rollouts.engine
        try:  # a group that fails to start, a ConfigError, Ctrl-C: stop what did start
            self.total_steps = self.plan.total_steps or t.epochs * self.rollouts.batches_per_epoch
            check_critic_only_steps(cfg, self.total_steps)  # before any worker starts
            # each LR schedule's length
            schedule = optimizer_steps(cfg, self.plan, self.total_steps)
            if self.plan.total_steps is None:  # else the printed plan warned already
                for line in short_warm_ups(cfg, self.plan, self.total_steps):
                    print(f"warning: {line}", flush=True)
            self.policy = WorkerGroup("policy", cfg, schedule["policy"])
            colocate = self.policy if t.colocate_policy_ref else None
            self.reference = (
                WorkerGroup("reference", cfg, 0, colocate)  # it takes no optimizer step
                if has_reference_workers(cfg)
                else None
            )
            uses_critic = cfg.algorithm.uses_critic
            self.critic = WorkerGroup("critic", cfg, schedule["critic"]) if uses_critic else None
            self.engine_sync = EngineSync.start(self.policy, self.engine, self.rollouts, cfg)
            self.kl_ctrl = build_kl_controller(cfg.algorithm)
            self.reuse_training_logprobs = self._decide_old_logprobs()
            """The step is exactly on-policy: the training forward's logprobs are the old ones."""
        except BaseException:
            self._stop_started()
            raise
        self.checkpoints = CheckpointManager(self.output_dir / "checkpoints", t.max_ckpts_to_keep)
        self._unpublished: Path | None = None
        """A checkpoint saved by the running step, published once the step is logged."""
        self.moved_since_checkpoint = False
        """Some step moved the policy's or critic's weights since the last checkpoint (or since
        the start: the initial weights, or the resumed checkpoint's, are saved already)."""
        self.step = 0
        self.policy_version = 0
        """Weight syncs so far: the version of the weights the engines hold."""
        self.consecutive_nonfinite = 0
        """Steps in a row with a refused (non-finite) mini-batch, refused in full or in part."""
        self.history: list[dict[str, float]] = []
        self.tracker: Tracker | None = None

    # -- the loop --------------------------------------------------------------------

    def train(self) -> list[dict[str, float]]:
        """Resume if asked, then run every remaining step; returns the metrics history."""
        from skyrl.tracking import Tracker

        t = self.cfg.trainer
        resumed = self.resume()
        self.tracker = tracker = Tracker(
            loggers=list(t.loggers),
            output_dir=self.output_dir,
            config=dataclasses.asdict(self.cfg),
            run_name=self.output_dir.name,
            total_steps=self.total_steps,
            start_step=self.step,
            # another run's checkpoint: the records here are not its steps before the resume
            history_here=resumed is None or self.checkpoints.holds(resumed),
        )
        try:
            if resumed is not None:
                if self.step >= self.total_steps:
                    print(self._nothing_to_train(resumed), flush=True)
                else:
                    print(f"resumed from {resumed} at step {self.step}", flush=True)
                self.sync_weights(self.policy_version)
                self._eval_unlogged_step(resumed)
            if t.eval_before_train and self.step == 0 and self.rollouts.has_eval():
                self.log(0, self.evaluate())
            while self.step < self.total_steps:
                self.step += 1
                self.log(self.step, self.run_step(self.step))
                if self._unpublished is not None:
                    # resumable only once the step's record is written: a kill between the
                    # two resumed after a step whose metrics line was never written
                    self.checkpoints.publish(self._unpublished)
                    self._unpublished = None
                self.check_nonfinite()
            self.wait_for_engines()
        except BaseException:  # a crash or an interrupt: the trackers mark the run failed
            try:
                tracker.close(failed=True)
            except Exception as exc:  # the same full disk, say: the run's own error is shown
                print(f"warning: closing the trackers failed too: {exc}", file=sys.stderr)
            raise
        tracker.close()
        return self.history

    def _nothing_to_train(self, resumed: Path) -> str:
        """The line for a resume at or past ``total_steps``: no step runs; the export, if on,
        writes the checkpoint's weights again (what ``export``'s error line promises)."""
        export = "; exporting its weights" if self.cfg.trainer.export_hf else ""
        return (
            f"checkpoint {resumed} is at step {self.step} and trainer.total_steps is "
            f"{self.total_steps}: nothing to train (raise trainer.total_steps to continue)"
            f"{export}"
        )

    def run_step(self, step: int) -> dict[str, float]:
        """One training step; returns its metrics (timings included)."""
        t = self.cfg.trainer
        timer = PhaseTimer()
        with timer("generate"):
            try:
                batch, metrics = self.rollouts.next_batch(step)
            except WeightSyncTimeout as exc:  # the batch waited for a background weight load
                version = self.engine_sync.loading_version()
                assert version is not None
                raise self._sync_timed_out(SyncTimedOut(version, str(exc))) from None
        with timer("forward"):
            batch = self.add_logprobs_and_values(batch, step)
        batch, adv_metrics = self.add_advantages(batch)
        metrics.update(adv_metrics)
        with timer("train"):
            train_metrics, batch = self.train_on(batch, step)
        metrics.update(train_metrics)
        metrics.update(rollout_logprob_mismatch(batch, self.policy_version))
        # a refused mini-batch leaves the weights as they were, but the step's other
        # mini-batches still stepped: sync what moved; checkpoint (at the cadence and at the
        # end) if anything moved since the last checkpoint, this step or an earlier one
        policy_moved = metrics.get(names.POLICY.optimizer_steps, 0.0) > 0
        moved = policy_moved or metrics.get(names.CRITIC.optimizer_steps, 0.0) > 0
        self.moved_since_checkpoint |= moved
        nonfinite = any(metrics.get(r.nonfinite, 0.0) > 0 for r in (names.POLICY, names.CRITIC))
        self.consecutive_nonfinite = self.consecutive_nonfinite + 1 if nonfinite else 0
        metrics[names.TRAIN_REFUSED] = float(nonfinite and not moved)
        last = step == self.total_steps
        if policy_moved:  # else the engines hold these weights already (refused, critic-only)
            with timer("sync"):
                self.sync_weights(self.policy_version + 1)
        due = (t.ckpt_interval and step % t.ckpt_interval == 0) or last
        if due and self.moved_since_checkpoint:
            with timer("checkpoint"):
                self._unpublished = self.save_checkpoint(step, publish=False)
            self.moved_since_checkpoint = False
        if self.rollouts.has_eval() and ((t.eval_interval and step % t.eval_interval == 0) or last):
            with timer("eval"):
                metrics.update(self.evaluate())
        compute = (
            timer.seconds["generate"]
            + timer.seconds.get("eval", 0.0)
            + metrics.pop(names.FORWARD_COMPUTE_S, 0.0)
            + metrics.pop(names.POLICY.compute_s, 0.0)
            + metrics.pop(names.CRITIC.compute_s, 0.0)
        )
        metrics.update(timer.metrics(compute))
        return metrics

    # -- logprobs, advantages, training ------------------------------------------------

    def add_logprobs_and_values(self, batch: TrainingInputBatch, step: int) -> TrainingInputBatch:
        """Old policy logprobs, reference logprobs and critic values via the workers' forward
        (old logprobs only where the step is not exactly on-policy: ``skyrl.trainer.on_policy``)."""
        needs_ref = self.cfg.algorithm.uses_reference
        reuse = reuses_on_step(self.cfg, self.reuse_training_logprobs, step)
        if reuse and not needs_ref and self.critic is None:
            return batch  # nothing to compute before training
        staged = self._stage(batch, self.cfg.trainer.policy_mini_batch_size, loss_weights=False)
        mask = batch.loss_mask
        fields = {}
        if not reuse:
            fields["old_logprobs"] = self.policy.forward(staged, len(batch)) * mask
        if self.reference is not None:
            fields["ref_logprobs"] = self.reference.forward(staged, len(batch)) * mask
        elif needs_ref:  # LoRA
            ref = self.policy.forward(staged, len(batch), method="reference_forward")
            fields["ref_logprobs"] = ref * mask
        if self.critic is not None:
            fields["values"] = self.critic.forward(staged, len(batch)) * mask
        return batch.replace(**fields)

    def add_advantages(
        self, batch: TrainingInputBatch
    ) -> tuple[TrainingInputBatch, dict[str, float]]:
        """KL-in-reward (if set), then advantages and returns; step-wise broadcast."""
        a = self.cfg.algorithm
        token_rewards, metrics = None, {}
        if a.use_kl_in_reward:
            kl = masked_kl(
                a.kl_estimator,
                batch.require("old_logprobs"),
                batch.require("ref_logprobs"),
                batch.loss_mask,
            )
            token_rewards = -self.kl_ctrl.value * kl
            mean_kl = float((kl * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
            metrics = {"algorithm/kl_coef": self.kl_ctrl.value, "algorithm/kl_in_reward": mean_kl}
            # kl_horizon is in samples: trajectories, not the rows of their turns
            num_trajectories = sum(batch.metadata.get("is_last_step") or [True] * len(batch))
            self.kl_ctrl.update(mean_kl, num_trajectories)
        inputs = AdvantageInputs(
            self._finite_rewards(batch),
            batch.loss_mask,
            batch.metadata["uids"],
            batch.values,
            token_rewards,
        )
        if self._multi_row(batch):
            adv, ret = broadcast_last_step_advantages(
                inputs, a, batch.metadata["is_last_step"], batch.metadata.get("trajectory_ids")
            )
        else:
            adv, ret = compute_advantages(inputs, a)
        return batch.replace(advantages=adv, returns=ret), metrics

    def _finite_rewards(self, batch: TrainingInputBatch) -> torch.Tensor:
        """The rows' rewards; a non-finite one (a custom driver's ``Trajectory.reward``, or one
        past float32's range, inf in these float32 rows) would make every advantage of its
        group NaN and the steps be refused as a non-finite loss: ``TrainingAborted`` naming the
        trajectory and its reward instead. The built-in loop and the external-agent harness
        count a NaN or inf reward as an env error before it gets here."""
        rewards = batch.require("rewards")
        bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
        if bad:
            ids = batch.metadata.get("trajectory_ids") or batch.metadata["uids"]
            first = float(rewards[bad[0]])
            raise TrainingAborted(
                f"step {self.step}: trajectory {ids[bad[0]]!r} has reward {first:g} "
                f"in the training rows (float32; {len(bad)} of {len(rewards)} rows non-finite): "
                f"generator.agent={self.cfg.generator.agent} must give finite rewards within "
                f"+-{REWARD_MAX:.4g}; {self._last_checkpoint('last checkpoint')}"
            )
        return rewards

    def train_on(
        self, batch: TrainingInputBatch, step: int
    ) -> tuple[dict[str, float], TrainingInputBatch]:
        """``update_epochs_per_batch`` passes over the prompt-unit mini-batches (critic first);
        the policy waits during the first ``critic_only_steps`` steps. Returns the metrics and
        the batch, with its old logprobs from the training forward on an on-policy step."""
        t = self.cfg.trainer
        from_training = None
        if reuses_on_step(self.cfg, self.reuse_training_logprobs, step):
            metadata = {**batch.metadata, OLD_LOGPROBS_FROM_TRAINING: True}
            batch = TrainingInputBatch(batch.tensors, metadata)
            from_training = torch.zeros_like(batch.loss_mask)
        policy_records: list[TrainStats] = []
        critic_records: list[TrainStats] = []
        train_policy = step > t.critic_only_steps
        # staged once per mini-batch size: the same chunks serve every epoch (and both roles)
        staged: dict[int, list] = {}

        def stage(mini_batch_size: int) -> list:
            if mini_batch_size not in staged:
                staged[mini_batch_size] = self._stage(batch, mini_batch_size)
            return staged[mini_batch_size]

        policy_staged = stage(t.policy_mini_batch_size) if train_policy else []
        critic = self.critic
        critic_staged = stage(t.critic_mini_batch_size) if critic is not None else []
        for _ in range(t.update_epochs_per_batch):
            for chunks in critic_staged:
                assert critic is not None
                critic_records.append(critic.train_mini_batch(chunks))
            for chunks in policy_staged:
                policy_records.append(self.policy.train_mini_batch(chunks, from_training))
        out = {
            **step_metrics(names.CRITIC, critic_records),
            **step_metrics(names.POLICY, policy_records),
        }
        forward_s = sum(g.compute_s for g in (self.policy, self.reference, self.critic) if g)
        for group in (self.policy, self.reference, self.critic):
            if group is not None:
                group.compute_s = 0.0
        out[names.FORWARD_COMPUTE_S] = forward_s
        if from_training is not None:
            batch = batch.replace(old_logprobs=from_training * batch.loss_mask)
        return out, batch

    # -- weights, checkpoints, eval ------------------------------------------------------

    def sync_weights(self, version: int) -> None:
        """Policy weights into the inference engines (``EngineSync``: the path
        ``trainer.weight_sync`` picks; in the background with asynchronous training); the
        engines then hold policy version ``version``. A sync that takes longer than
        ``trainer.weight_sync_timeout_s`` ends the run (``WeightSyncTimedOut``)."""
        try:
            self.engine_sync.sync(version)
        except SyncTimedOut as exc:
            raise self._sync_timed_out(exc) from None
        self.policy_version = version

    def wait_for_engines(self) -> None:
        """Wait for a weight load still running in the background (asynchronous training)."""
        try:
            self.engine_sync.wait()
        except SyncTimedOut as exc:
            raise self._sync_timed_out(exc) from None

    def _sync_timed_out(self, exc: SyncTimedOut) -> WeightSyncTimedOut:
        timeout = self.cfg.trainer.weight_sync_timeout_s
        return WeightSyncTimedOut(
            f"weight sync to policy version {exc.version} did not finish within "
            f"trainer.weight_sync_timeout_s={timeout:g}: still waiting for {exc.waiting_for}; "
            f"stopped at step {self.step}; {self._last_checkpoint('last checkpoint')}"
        )

    def save_checkpoint(self, step: int, publish: bool = True) -> Path:
        """Workers' state, trainer state, dataloader state, RNG: temp dir, rename, ``latest``
        (``publish=False``: not yet; ``train`` publishes after the step's metrics are logged).
        A save that fails (a full disk, a read-only dir) ends the run with ``TrainingAborted``
        saying where, the free space there, what resumes, and the original reason; its
        half-written temp dir is removed."""
        from skyrl.models.fingerprint import BASE_FINGERPRINT, base_fingerprint
        from skyrl.workers.group import WorkerDiedError

        tmp = None
        try:
            tmp = self.checkpoints.temp_dir(step)
            for group in (self.policy, self.critic):
                if group is not None:
                    group.run("save_checkpoint", str(tmp), {"step": step})
            state = {
                "step": step,
                "rollouts": self.rollouts.state_dict(),
                "policy_version": self.policy_version,
                "kl_coef": self.kl_ctrl.value,
                "consecutive_nonfinite": self.consecutive_nonfinite,
                "zero_stage": self.cfg.trainer.zero_stage,
                "precision": resolve_precision(self.cfg),  # its files: ``check_resumable``
            }
            if self.cfg.model.lora.enabled:  # the adapters only: the base they fit is recorded
                fingerprint = base_fingerprint(self.cfg.model.path)  # None: no safetensors
                state.update({BASE_FINGERPRINT: fingerprint} if fingerprint else {})
            elif self.cfg.algorithm.uses_reference:  # the reference workers load model.path
                fingerprint = base_fingerprint(self.cfg.model.path)
                state.update({REFERENCE_FINGERPRINT: fingerprint} if fingerprint else {})
            return self.checkpoints.commit(tmp, step, state, publish=publish)
        except WorkerDiedError:  # a dead worker: its own one-line error says it
            raise
        except Exception as exc:  # a worker's write or the trainer's own
            failed = self._save_failed(step, exc)  # the free space while the temp dir is there
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)  # it holds the space the user needs
            raise failed from exc

    def _save_failed(self, step: int, exc: Exception) -> TrainingAborted:
        root = self.checkpoints.root
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        return TrainingAborted(
            f"saving the checkpoint of step {step} into {root} failed ({free_space(root)} free "
            f"there); {self._resumes_from()}; {reason}"
        )

    def _resumes_from(self) -> str:
        """The checkpoint ``trainer.resume=auto`` continues from, for an error line."""
        latest = self.checkpoints.resumable()
        if latest is None:
            return "no checkpoint was saved"
        return f"last checkpoint: {latest} (trainer.resume=auto continues from it)"

    def resume(self) -> Path | None:
        """Restore the checkpoint ``trainer.resume`` names; returns its path (None = fresh).
        A LoRA checkpoint trained on another base model than ``model.path`` (its recorded
        fingerprint: ``check_base_model``) is refused before the workers load it, as is a
        full-weights checkpoint of a run with a reference model resumed with that reference on
        another ``model.path``. An adaptive KL controller's coefficient is restored; a fixed
        one stays the config's ``algorithm.init_kl_coef`` (a line says when it differs from
        the saved)."""
        from skyrl.algorithms.kl_controllers import FixedKLController
        from skyrl.trainer.checkpoint import BASE_FINGERPRINT, check_base_model

        ckpt = resolve_resume(self.cfg.trainer.resume, self.checkpoints)
        if ckpt is None:
            return None
        state = read_trainer_state(ckpt)
        check_resumable(ckpt, state, self.cfg.trainer.zero_stage)  # before the workers load it
        # a LoRA run's adapters fit that base only; a full-weights run's reference is model.path
        if BASE_FINGERPRINT in state or (
            REFERENCE_FINGERPRINT in state and self.cfg.algorithm.uses_reference
        ):
            check_base_model(ckpt, state, self.cfg.model.path)
        for group in (self.policy, self.critic):
            if group is not None:
                self._load_workers(group, ckpt)
        self.step = int(state["step"])
        self.rollouts.load_state_dict(state.get("rollouts") or {"loader": state.get("loader")})
        self.policy_version = int(state.get("policy_version", self.step))
        saved_kl_coef = float(state["kl_coef"])
        if not isinstance(self.kl_ctrl, FixedKLController):  # adaptive: its state
            self.kl_ctrl.value = saved_kl_coef
        elif self.kl_ctrl.value != saved_kl_coef:  # fixed: the config's, as kl_loss_coef is
            print(
                "resumed with the config's algorithm.init_kl_coef over the saved KL coefficient: "
                f"{saved_kl_coef} -> {self.kl_ctrl.value}",
                flush=True,
            )
        self.consecutive_nonfinite = int(state.get("consecutive_nonfinite", 0))
        self.checkpoints.resume_from(ckpt)  # before the tracker drops the later records
        foreign = not self.checkpoints.holds(ckpt)
        run_dir = self.checkpoints.root.parent  # output_dir
        moved = set_aside_abandoned_export(run_dir, self.step, foreign)
        if moved is not None:
            print(moved, flush=True)
        return ckpt

    def _eval_unlogged_step(self, resumed: Path) -> None:
        """Evaluate and log the resumed step when its record was never written and its eval is
        due: a run stopped after the step's checkpoint was saved but before the step was logged
        (in its eval, say: ``train`` publishes a checkpoint only then) resumes that checkpoint
        when no ``latest`` names an earlier one (``trainer.resume=auto``: the newest complete
        one), and the eval never ran; at the last step there is nothing to train, so the run
        had no final eval at all. The step's training metrics went with the stopped process:
        its record holds the eval only."""
        from skyrl.tracking.jsonl import FILENAME, read_records

        t = self.cfg.trainer
        if not self.rollouts.has_eval() or not self.checkpoints.holds(resumed):
            return  # another run's checkpoint: its records are in that run's dir
        if not ((t.eval_interval and self.step % t.eval_interval == 0)
                or self.step >= self.total_steps):  # fmt: skip
            return
        metrics = self.output_dir / FILENAME
        records = read_records(metrics) if metrics.is_file() else []
        if all(r["step"] != self.step for r in records):
            self.log(self.step, self.evaluate())

    @staticmethod
    def _load_workers(group, ckpt: Path) -> None:
        """``group`` loads ``ckpt`` and prints which saved optimizer settings the config
        changed; a file it cannot load (damaged, truncated, missing: another
        ``trainer.zero_stage``, another model) is a ``ConfigError`` naming ``trainer.resume``,
        the checkpoint and the worker's reason, in one line; the checkpoint is left as it is."""
        from skyrl.workers.group import WorkerDiedError

        try:
            changed = group.run("load_checkpoint", str(ckpt))[0]
        except WorkerDiedError:  # a dead worker: its own one-line error says it
            raise
        except RuntimeError as exc:  # the group's "<role> worker rank <r> failed: <Type>: <line>"
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                "trainer.resume",
                f"{ckpt} could not be loaded ({reason}): resume it with the model.path, "
                "trainer.zero_stage and model.lora it was saved with, or from another checkpoint",
            ) from exc
        if changed:  # the workers train with the config's values (``load_checkpoint``)
            settings = ", ".join(f"{key} {saved} -> {now}" for key, (saved, now) in changed.items())
            print(
                f"resumed with the config's optimizer settings over the saved: {settings}",
                flush=True,
            )

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics from the rollout source (``eval/...``), at the trained weights."""
        self.wait_for_engines()
        return self.rollouts.evaluate()

    def check_nonfinite(self) -> None:
        """Abort after ``max_consecutive_nonfinite`` steps in a row with a refused mini-batch."""
        limit = self.cfg.trainer.max_consecutive_nonfinite
        if self.consecutive_nonfinite >= limit:
            raise TrainingAborted(
                f"{self.consecutive_nonfinite} consecutive steps had a non-finite loss or grad "
                f"norm (trainer.max_consecutive_nonfinite={limit}); stopped at step {self.step}; "
                f"{self._last_checkpoint('last good checkpoint')}"
            )

    def _last_checkpoint(self, label: str) -> str:
        """``<label>: <path>`` of the checkpoint a resume continues from, for an error line."""
        latest = self.checkpoints.resumable()
        return f"{label}: {latest}" if latest else "no checkpoint was saved"

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """To every configured sink (console line, jsonl, trackers)."""
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(record)
        if self.tracker is None:
            raise RuntimeError("RLTrainer.log is called from train() only")
        try:
            self.tracker.log(step, metrics)
        except OSError as exc:  # a full disk, a run dir gone: the metrics file takes no line
            raise TrainingAborted(
                f"writing the metrics of step {step} into {self.output_dir} failed "
                f"({free_space(self.output_dir)} free there); {self._resumes_from()}; {exc}"
            ) from exc

    def export(self) -> Path:
        """The final policy as a ``from_pretrained`` directory (with LoRA: the adapters merged
        in, and the PEFT adapter directory ``final_adapter`` beside it), recording the step
        it holds (``EXPORT_RECORD``: ``skyrl-eval`` of the run prefers a newer checkpoint).
        An export that fails (a full disk, an unwritable ``final_hf``) ends the run with
        ``TrainingAborted`` saying where, the free space there, the checkpoint that holds the
        trained weights and the original reason. Each folder is written beside the earlier
        export (``<name>.partial``) and replaces it only once complete: a failed export
        leaves the earlier one as it was (its record naming its own step)."""
        from skyrl.workers.group import WorkerDiedError

        out = self.output_dir / "final_hf"
        adapter = self.output_dir / "final_adapter" if self.cfg.model.lora.enabled else None
        folders = [out] + ([adapter] if adapter else [])
        partial = {folder: folder.with_name(folder.name + ".partial") for folder in folders}
        try:
            for staged in partial.values():  # a killed export's
                shutil.rmtree(staged, ignore_errors=True)
            self.policy.run(
                "export_hf",
                str(partial[out]),
                self.cfg.model.tokenizer_path,
                adapter and str(partial[adapter]),
            )
            write_export_record(partial[out], self.step)
            for folder, staged in partial.items():
                _replace_dir(folder, staged)
        except WorkerDiedError:  # a dead worker: its own one-line error says it
            raise
        except Exception as exc:  # a worker's write or the trainer's own
            for staged in partial.values():
                shutil.rmtree(staged, ignore_errors=True)
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            latest = self.checkpoints.latest()
            saved = (
                f"the trained weights are in the last checkpoint: {latest} (re-running with "
                "trainer.resume=auto exports it again)"
                if latest
                else "no checkpoint was saved"
            )
            raise TrainingAborted(
                f"exporting the policy of step {self.step} into {out} failed "
                f"({free_space(out)} free there); {saved}; {reason}"
            ) from exc
        return out

    def _stop_started(self) -> None:
        """Stop what a failed ``__init__`` started (the rollout source and its engines, the
        worker groups up so far): ``shutdown``, the components not reached taken as absent."""
        for name in ("policy", "reference", "critic", "engine_sync"):
            if not hasattr(self, name):
                setattr(self, name, None)
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the rollout source, the worker groups, the engines and the shared-memory file,
        each whatever the others do: one that fails to stop is logged in one line and the rest
        are still stopped. Raises nothing, so the run's own result or error is what the caller
        sees (``skyrl.train`` calls this in a ``finally``)."""
        import logging

        stops = [("rollout source", self.rollouts.close)]
        groups = {"critic": self.critic, "reference": self.reference, "policy": self.policy}
        stops += [(f"{n} workers", g.shutdown) for n, g in groups.items() if g is not None]
        if self.engine is not None:
            stops.append(("inference engines", self.engine.shutdown))
        if self.engine_sync is not None:
            stops.append(("shared-memory weights", self.engine_sync.close))
        for name, stop in stops:
            try:
                stop()
            except Exception as exc:  # the others must still stop
                why = (str(exc).splitlines() or [""])[0]
                logging.getLogger(__name__).error(
                    "shutdown: stopping the %s failed: %s%s",
                    name, type(exc).__name__, f": {why}" if why else "",
                )  # fmt: skip

    # -- helpers ---------------------------------------------------------------------

    def _decide_old_logprobs(self) -> bool:
        """Whether the training forward's logprobs serve as the old ones (the config allows it
        and the policy's training forward has no dropout); says which at start."""
        reason = separate_forward_reason(self.cfg)
        if reason is None:
            dropout = self.policy.run("active_dropout")[0]
            if dropout:
                reason = f"dropout in the policy's training forward: {', '.join(dropout[:3])}"
        print(f"old logprobs: {describe(self.cfg, reason)}", flush=True)
        return reason is None

    def _multi_row(self, batch: TrainingInputBatch) -> bool:
        """Whether a trajectory may have several rows: step-wise, or some trajectory forked
        (``GeneratorOutput.forks``: an external agent's session that edited its history)."""
        return self.cfg.generator.step_wise or any(batch.metadata.get("forks", ()))

    def _stage(self, batch: TrainingInputBatch, mini_batch_size: int, loss_weights: bool = True):
        """Prompt-unit mini-batches of ``mini_batch_size`` prompts, split over the DP ranks."""
        t, g, a = self.cfg.trainer, self.cfg.generator, self.cfg.algorithm
        uids = batch.metadata["uids"]
        bounds = compute_prompt_mini_batch_boundaries(
            uids, mini_batch_size, t.train_batch_size, step_wise=self._multi_row(batch)
        )
        weights_fn = None
        if loss_weights:

            def weights_fn(mini: TrainingInputBatch) -> torch.Tensor:
                return compute_loss_weights(
                    a.loss_reduction, mini.loss_mask, mini.metadata["uids"], g.max_seq_len
                )

        return MeshDispatch.stage_chunks(t.dp_size, batch, bounds, loss_weights_fn=weights_fn)


class PhaseTimer:
    """Wall time per phase of one step, and the framework overhead share."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self, compute_s: float) -> dict[str, float]:
        """``timing/<phase>_s``, ``timing/step_s`` and ``timing/overhead_frac``: the share of the
        step that is not generation or the workers' forward / backward / optimizer compute."""
        step = time.perf_counter() - self.started
        out = {f"timing/{phase}_s": s for phase, s in self.seconds.items()}
        out[names.STEP_TIME] = step
        out[names.OVERHEAD_FRAC] = max(0.0, 1.0 - compute_s / step) if step > 0 else 0.0
        return out


def rollout_logprob_mismatch(batch: TrainingInputBatch, version: int) -> dict[str, float]:
    """Mean |trainer logprob - engine logprob| over the trained tokens: ~0 (numerics) when the
    engine samples with the policy's current weights; a stale engine or bf16 shows here. Also
    per staleness value (asynchronous training: ``version`` minus the version at dispatch of
    the row's first turn) unless every row's is 0: a batch of one staleness value above 0
    gets its one key, an on-policy batch none."""
    if batch.rollout_logprobs is None:
        return {}
    mask = batch.loss_mask
    per_token = (batch.require("old_logprobs") - batch.rollout_logprobs).abs() * mask
    out = {names.LOGPROB_ABS_DIFF: float(per_token.sum() / mask.sum().clamp(min=1))}
    versions = batch.metadata.get("policy_versions")
    if not versions:
        return out
    staleness = [version - min(d for d, _ in v) if v else 0 for v in versions]
    if len(set(staleness)) > 1 or staleness[0] != 0:
        for value in sorted(set(staleness)):
            rows = torch.tensor([s == value for s in staleness])
            tokens = mask[rows].sum().clamp(min=1)
            out[f"{names.LOGPROB_DIFF_BY_STALENESS}{value}"] = float(per_token[rows].sum() / tokens)
    return out


def _replace_dir(folder: Path, staged: Path) -> None:
    """``staged`` (complete) becomes ``folder``; the folder it replaces is removed after."""
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    staged.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
