"""The RL loop: rollouts, logprobs, advantages, train, checkpoint, sync, eval, log.

``RLTrainer.train`` reads like the algorithm; each stage is one method. The
mini-batches of a step are cut in PROMPT units, so a step always takes
``train_batch_size / policy_mini_batch_size * update_epochs_per_batch``
optimizer steps, whatever the number of turns.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from skyrl.algorithms import compute_advantages, compute_loss_weights, finalize_metrics
from skyrl.algorithms.advantages import AdvantageInputs
from skyrl.algorithms.advantages.step_wise import broadcast_last_step_advantages
from skyrl.algorithms.kl import masked_kl
from skyrl.algorithms.kl_controllers import build_kl_controller
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import uses_broadcast_sync
from skyrl.data import PromptRow, load_prompts
from skyrl.dispatch import MeshDispatch
from skyrl.models.resolve import with_local_model_paths
from skyrl.trainer import dynamic_sampling as ds
from skyrl.trainer.checkpoint import CheckpointManager, read_trainer_state, resolve_resume
from skyrl.trainer.dataloader import PromptLoader
from skyrl.trainer.evaluation import eval_metrics
from skyrl.trainer.plan import make_plan
from skyrl.trainer.weight_sync import BroadcastWeightSync

LOW_PASS_RATE_WARNING = 0.7
"""Dynamic sampling warns when fewer than this share of groups carry signal."""

PHASES = ("generate", "forward", "train", "checkpoint", "sync", "eval")
"""Timed phases of a step (``timing/<phase>_s``)."""


class TrainingAborted(RuntimeError):
    """The run stopped on purpose (too many consecutive non-finite steps)."""


class RLTrainer:
    """Owns the engine, the generator and the worker groups of one run."""

    def __init__(self, cfg: SkyRLConfig, output_dir: Path):
        from transformers import AutoTokenizer

        from skyrl.generators import make_generator
        from skyrl.inference.factory import make_engine
        from skyrl.workers.group import WorkerGroup

        self.cfg = with_local_model_paths(cfg)  # workers and engines see local directories only
        model_path, tokenizer_path = self.cfg.model.path, self.cfg.model.tokenizer_path
        self.output_dir = Path(output_dir)
        self.plan = make_plan(self.cfg)
        t = cfg.trainer
        self.fake = cfg.data.source == "fake"  # random rollouts, no engine: the trainer path alone
        rows = [] if self.fake else load_prompts(cfg.data, cfg.environment, "train")
        self.loader = None if self.fake else PromptLoader(rows, t.train_batch_size, t.seed)
        self.eval_rows = [] if self.fake else load_prompts(cfg.data, cfg.environment, "eval")
        per_epoch = cfg.data.num_train_prompts // t.train_batch_size
        self.total_steps = self.plan.total_steps or t.epochs * (
            per_epoch if self.fake else self.loader.batches_per_epoch
        )
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.engine = None if self.fake else make_engine(cfg.generator, model_path, tokenizer_path)
        self.generator = (
            None
            if self.fake
            else make_generator(cfg.generator, cfg.environment, self.engine, self.tokenizer)
        )
        optimizer_steps = self.total_steps * self.plan.optimizer_steps_per_step
        self.policy = WorkerGroup("policy", self.cfg, optimizer_steps)
        colocate = self.policy if t.colocate_policy_ref else None
        self.reference = (
            WorkerGroup("reference", self.cfg, optimizer_steps, colocate)
            if cfg.algorithm.uses_reference
            else None
        )
        self.critic = (
            WorkerGroup("critic", self.cfg, optimizer_steps) if cfg.algorithm.uses_critic else None
        )
        self.weight_sync = (
            BroadcastWeightSync(self.policy, self.engine, self.cfg)
            if self.engine is not None and uses_broadcast_sync(self.cfg)
            else None
        )
        self.kl_ctrl = build_kl_controller(cfg.algorithm)
        self.checkpoints = CheckpointManager(self.output_dir / "checkpoints", t.max_ckpts_to_keep)
        self.step = 0
        self.consecutive_nonfinite = 0
        self.history: list[dict[str, float]] = []
        self.tracker = None

    # -- the loop --------------------------------------------------------------------

    def train(self) -> list[dict[str, float]]:
        """Resume if asked, then run every remaining step; returns the metrics history."""
        from skyrl.tracking import Tracker

        t = self.cfg.trainer
        resumed = self.resume()
        self.tracker = Tracker(
            loggers=list(t.loggers),
            output_dir=self.output_dir,
            config=dataclasses.asdict(self.cfg),
            run_name=self.output_dir.name,
            total_steps=self.total_steps,
            start_step=self.step,
        )
        try:
            if resumed is not None:
                print(f"resumed from {resumed} at step {self.step}", flush=True)
                self.sync_weights()
            if t.eval_before_train and self.step == 0 and self.eval_rows:
                self.log(0, self.evaluate())
            while self.step < self.total_steps:
                self.step += 1
                self.log(self.step, self.run_step(self.step))
                self.check_nonfinite()
        finally:
            self.tracker.close()
        return self.history

    def run_step(self, step: int) -> dict[str, float]:
        """One training step; returns its metrics (timings included)."""
        t = self.cfg.trainer
        timer = PhaseTimer()
        with timer("generate"):
            batch, metrics = self.fake_rollouts(step) if self.fake else self.collect_rollouts(step)
        with timer("forward"):
            batch = self.add_logprobs_and_values(batch)
        metrics.update(rollout_logprob_mismatch(batch))
        batch, adv_metrics = self.add_advantages(batch)
        metrics.update(adv_metrics)
        with timer("train"):
            metrics.update(self.train_on(batch, step))
        refused = any(metrics.get(f"{r}/nonfinite", 0.0) > 0 for r in ("policy", "critic"))
        self.consecutive_nonfinite = self.consecutive_nonfinite + 1 if refused else 0
        metrics["train/refused"] = float(refused)
        last = step == self.total_steps
        if not refused:
            with timer("sync"):
                self.sync_weights()
        if not refused and ((t.ckpt_interval and step % t.ckpt_interval == 0) or last):
            with timer("checkpoint"):
                self.save_checkpoint(step)
        if self.eval_rows and ((t.eval_interval and step % t.eval_interval == 0) or last):
            with timer("eval"):
                metrics.update(self.evaluate())
        compute = (
            timer.seconds["generate"]
            + timer.seconds.get("eval", 0.0)
            + metrics.pop("forward/compute_s", 0.0)
            + metrics.pop("policy/compute_s", 0.0)
            + metrics.pop("critic/compute_s", 0.0)
        )
        metrics.update(timer.metrics(compute))
        return metrics

    # -- rollouts --------------------------------------------------------------------

    def collect_rollouts(self, step: int) -> tuple[TrainingInputBatch, dict[str, float]]:
        """The step's prompts -> rollouts -> reward shaping -> dynamic sampling -> batch."""
        from skyrl.generators import to_training_batch

        a, need = self.cfg.algorithm, self.cfg.trainer.train_batch_size
        rounds, good, flat = [], [], []
        while True:
            rows = self.loader.next_batch(f"s{step}r{len(rounds)}")
            out = self.generate(rows, self.sampling_seed(step, len(rounds)))
            rounds.append(out)
            shaping = self.shape_rewards(out)
            if a.dynamic_sampling != "filter":
                break
            informative = ds.informative_uids(out)
            good.append(ds.keep_groups(out, informative))
            flat_uids = [u for u in ds.group_rows(out) if u not in informative]
            flat.append(ds.keep_groups(out, flat_uids))
            collected = sum(len(set(g.uids)) for g in good)
            if collected >= need or len(rounds) >= a.max_sample_batches:
                break
        metrics = {**merge_rollout_metrics([r.metrics for r in rounds]), **shaping}
        if a.dynamic_sampling == "filter":
            out, ds_metrics = self._filled_batch(good, flat, need, len(rounds))
        elif a.dynamic_sampling == "replace":
            out, replaced = ds.replace_flat_groups(rounds[0], self.sampling_seed(step, 0))
            groups = len(ds.group_rows(out))
            ds_metrics = {"dynamic_sampling/kept_group_frac": 1.0 - replaced / groups}
        else:
            out, ds_metrics = rounds[0], {}
        if ds_metrics.get("dynamic_sampling/kept_group_frac", 1.0) < LOW_PASS_RATE_WARNING:
            warnings.warn(
                f"step {step}: dynamic sampling dropped "
                f"{1 - ds_metrics['dynamic_sampling/kept_group_frac']:.0%} of prompt groups "
                "(all samples got the same reward)",
                stacklevel=1,
            )
        metrics.update(ds_metrics)
        if self.cfg.trainer.dump_rollouts:
            dump_rollouts(out, self.tokenizer, self.output_dir / "rollouts" / f"step_{step}.jsonl")
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return to_training_batch(out, pad_id), metrics

    def _filled_batch(self, good, flat, need: int, num_rounds: int):
        """``need`` informative groups; when ``max_sample_batches`` ran out first, topped up with
        zero-variance groups (zero advantage) so the optimizer-step count stays fixed."""
        from skyrl.generators.output import GeneratorOutput

        pool = GeneratorOutput.concat(good + flat)
        uids = list(ds.group_rows(pool))
        n_good = sum(len(set(g.uids)) for g in good)
        if n_good < need:
            warnings.warn(
                f"dynamic sampling: {n_good} informative groups after {num_rounds} rounds "
                f"(algorithm.max_sample_batches); topped up with {need - n_good} flat groups",
                stacklevel=1,
            )
        generated = n_good + sum(len(set(f.uids)) for f in flat)
        metrics = {
            "dynamic_sampling/kept_group_frac": n_good / generated,
            "dynamic_sampling/rounds": float(num_rounds),
        }
        return ds.keep_groups(pool, uids[:need]), metrics

    def generate(self, rows: list[PromptRow], seed: int, evaluate: bool = False):
        """Rollouts of every prompt (``GeneratorOutput``), training or eval sampling."""
        from skyrl.inference.base import SamplingParams

        g = self.cfg.generator
        n = g.eval_n_samples_per_prompt if evaluate else g.n_samples_per_prompt
        sampling = SamplingParams.from_config(
            g.eval_sampling if evaluate else g.sampling, n=n, max_tokens=g.max_generate_length
        )
        sampling.seed = seed
        return self.generator.generate(rows, n, sampling)

    def sampling_seed(self, step: int, round_: int) -> int:
        """Per step and sampling round; from ``generator.sampling.seed`` or ``trainer.seed``."""
        base = self.cfg.generator.sampling.seed
        base = self.cfg.trainer.seed if base is None else base
        return (base * 1_000_003 + step * 1_009 + round_) % (2**31)

    def shape_rewards(self, out) -> dict[str, float]:
        """DAPO's overlong penalty and overlong filtering, in place."""
        a, metrics = self.cfg.algorithm, {}
        if a.overlong_buffer_len > 0:
            metrics["reward/overlong_penalty_mean"] = ds.overlong_penalty(
                out,
                self.cfg.generator.max_generate_length,
                a.overlong_buffer_len,
                a.overlong_penalty_factor,
            )
        if a.overlong_filter:
            metrics["reward/overlong_masked"] = float(ds.mask_truncated(out))
        return metrics

    def fake_rollouts(self, step: int) -> tuple[TrainingInputBatch, dict[str, float]]:
        """``data=fake``: random token rollouts with random 0/1 rewards (same path afterwards)."""
        from skyrl.workers.fake_rollouts import fake_rollouts

        g = self.cfg.generator
        batch = fake_rollouts(
            num_prompts=self.cfg.trainer.train_batch_size,
            n_samples_per_prompt=g.n_samples_per_prompt,
            vocab_size=len(self.tokenizer),
            prompt_len=(1, min(g.max_prompt_length, g.max_seq_len - 1)),
            response_len_mean=g.max_generate_length / 2,
            max_seq_len=g.max_seq_len,
            seed=self.cfg.data.seed + step,
            step_wise=g.step_wise,
            max_turns=g.max_turns,
        )
        return batch, {"generate/reward_mean": float(batch.rewards.mean())}

    # -- logprobs, advantages, training ------------------------------------------------

    def add_logprobs_and_values(self, batch: TrainingInputBatch) -> TrainingInputBatch:
        """Old policy logprobs, reference logprobs and critic values via the workers' forward."""
        staged = self._stage(batch, self.cfg.trainer.policy_mini_batch_size, loss_weights=False)
        mask = batch.loss_mask
        fields = {"old_logprobs": self.policy.forward(staged, len(batch)) * mask}
        if self.reference is not None:
            fields["ref_logprobs"] = self.reference.forward(staged, len(batch)) * mask
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
            kl = masked_kl(a.kl_estimator, batch.old_logprobs, batch.ref_logprobs, batch.loss_mask)
            token_rewards = -self.kl_ctrl.value * kl
            mean_kl = float((kl * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
            metrics = {"algorithm/kl_coef": self.kl_ctrl.value, "algorithm/kl_in_reward": mean_kl}
            self.kl_ctrl.update(mean_kl, len(batch))
        inputs = AdvantageInputs(
            batch.rewards, batch.loss_mask, batch.metadata["uids"], batch.values, token_rewards
        )
        if self.cfg.generator.step_wise:
            adv, ret = broadcast_last_step_advantages(
                inputs, a, batch.metadata["is_last_step"], batch.metadata.get("trajectory_ids")
            )
        else:
            adv, ret = compute_advantages(inputs, a)
        return batch.replace(advantages=adv, returns=ret), metrics

    def train_on(self, batch: TrainingInputBatch, step: int) -> dict[str, float]:
        """``update_epochs_per_batch`` passes over the prompt-unit mini-batches (critic first);
        the policy waits during the first ``critic_only_steps`` steps."""
        t = self.cfg.trainer
        sums: dict[str, dict[str, float]] = {"critic": {}, "policy": {}}
        train_policy = step > t.critic_only_steps
        # staged once per mini-batch size: the same chunks serve every epoch (and both roles)
        staged: dict[int, list] = {}

        def stage(mini_batch_size: int) -> list:
            if mini_batch_size not in staged:
                staged[mini_batch_size] = self._stage(batch, mini_batch_size)
            return staged[mini_batch_size]

        policy_staged = stage(t.policy_mini_batch_size) if train_policy else []
        critic_staged = stage(t.critic_mini_batch_size) if self.critic is not None else []
        for _ in range(t.update_epochs_per_batch):
            for chunks in critic_staged:
                _accumulate(sums["critic"], self.critic.train_mini_batch(chunks))
            for chunks in policy_staged:
                _accumulate(
                    sums["policy"], {**self.policy.train_mini_batch(chunks), "optimizer_steps": 1.0}
                )
        out = {}
        for role, role_sums in sums.items():
            packing = {k: v for k, v in role_sums.items() if k.startswith("pack/")}
            raw = {k: role_sums.pop(k) for k in RAW_SUMS if k in role_sums}
            losses = {k: v for k, v in role_sums.items() if not k.startswith("pack/")}
            if role_sums:
                out.update(
                    {f"{role}/{k}": v for k, v in {**finalize_metrics(losses), **packing}.items()}
                )
            out.update({f"{role}/{k}": v for k, v in raw.items()})
        forward_s = sum(g.compute_s for g in (self.policy, self.reference, self.critic) if g)
        for group in (self.policy, self.reference, self.critic):
            if group is not None:
                group.compute_s = 0.0
        out["forward/compute_s"] = forward_s
        return out

    # -- weights, checkpoints, eval ------------------------------------------------------

    def sync_weights(self) -> None:
        """Policy weights into the inference engines, in buckets from rank 0: broadcast over
        the sync group, or through the object store (``trainer.weight_sync``)."""
        if self.engine is None:
            return
        if self.weight_sync is not None:
            self.weight_sync.sync()
        else:
            bucket_bytes = self.cfg.trainer.weight_sync_bucket_mb << 20
            self.engine.update_weights(self.policy.stream_weight_buckets(bucket_bytes))
        self.engine.reset_prefix_cache()

    def save_checkpoint(self, step: int) -> Path:
        """Workers' state, trainer state, dataloader state, RNG: temp dir, rename, ``latest``."""
        tmp = self.checkpoints.temp_dir(step)
        for group in (self.policy, self.critic):
            if group is not None:
                group.run("save_checkpoint", str(tmp), {"step": step})
        state = {
            "step": step,
            "loader": self.loader.state_dict() if self.loader else None,
            "kl_coef": self.kl_ctrl.value,
            "consecutive_nonfinite": self.consecutive_nonfinite,
        }
        return self.checkpoints.commit(tmp, step, state)

    def resume(self) -> Path | None:
        """Restore the checkpoint ``trainer.resume`` names; returns its path (None = fresh)."""
        ckpt = resolve_resume(self.cfg.trainer.resume, self.checkpoints)
        if ckpt is None:
            return None
        state = read_trainer_state(ckpt)
        for group in (self.policy, self.critic):
            if group is not None:
                group.run("load_checkpoint", str(ckpt))
        self.step = int(state["step"])
        if self.loader is not None and state.get("loader"):
            self.loader.load_state_dict(state["loader"])
        self.kl_ctrl.value = float(state["kl_coef"])
        self.consecutive_nonfinite = int(state.get("consecutive_nonfinite", 0))
        return ckpt

    def evaluate(self) -> dict[str, float]:
        """Held-out prompts with eval sampling: pass@1 (and pass@k) per data source."""
        g = self.cfg.generator
        started = time.perf_counter()
        rows = [dataclasses.replace(r, uid=f"eval{i}") for i, r in enumerate(self.eval_rows)]
        out = self.generate(rows, self.sampling_seed(0, 0), evaluate=True)
        metrics = eval_metrics(out, g.eval_n_samples_per_prompt)
        metrics["eval/seconds"] = time.perf_counter() - started
        return metrics

    def check_nonfinite(self) -> None:
        """Abort after ``max_consecutive_nonfinite`` refused steps in a row."""
        limit = self.cfg.trainer.max_consecutive_nonfinite
        if self.consecutive_nonfinite >= limit:
            latest = self.checkpoints.latest()
            where = f"last good checkpoint: {latest}" if latest else "no checkpoint was saved"
            raise TrainingAborted(
                f"{self.consecutive_nonfinite} consecutive steps had a non-finite loss or grad "
                f"norm (trainer.max_consecutive_nonfinite={limit}); stopped at step {self.step}; "
                f"{where}"
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """To every configured sink (console line, jsonl, trackers)."""
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(record)
        self.tracker.log(step, metrics)

    def export(self) -> Path:
        """The final policy as a ``from_pretrained`` directory."""
        out = self.output_dir / "final_hf"
        self.policy.run("export_hf", str(out), self.cfg.model.tokenizer_path)
        return out

    def shutdown(self) -> None:
        for group in (self.critic, self.reference, self.policy):
            if group is not None:
                group.shutdown()
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # -- helpers ---------------------------------------------------------------------

    def _stage(self, batch: TrainingInputBatch, mini_batch_size: int, loss_weights: bool = True):
        """Prompt-unit mini-batches of ``mini_batch_size`` prompts, split over the DP ranks."""
        t, g, a = self.cfg.trainer, self.cfg.generator, self.cfg.algorithm
        uids = batch.metadata["uids"]
        bounds = compute_prompt_mini_batch_boundaries(
            uids, mini_batch_size, t.train_batch_size, step_wise=g.step_wise
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
        out["timing/step_s"] = step
        out["timing/overhead_frac"] = max(0.0, 1.0 - compute_s / step) if step > 0 else 0.0
        return out


def rollout_logprob_mismatch(batch: TrainingInputBatch) -> dict[str, float]:
    """Mean |trainer logprob - engine logprob| over the trained tokens: ~0 (numerics) when the
    engine samples with the policy's current weights; a stale engine or bf16 shows here."""
    if batch.rollout_logprobs is None:
        return {}
    mask = batch.loss_mask
    diff = ((batch.old_logprobs - batch.rollout_logprobs).abs() * mask).sum()
    return {"rollout/logprob_abs_diff": float(diff / mask.sum().clamp(min=1))}


def dump_rollouts(out, tokenizer, path: Path) -> None:
    """One JSON line per training row: ids, text, loss mask, reward and grouping metadata."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(len(out)):
            row = {
                "uid": out.uids[i],
                "trajectory_id": out.trajectory_ids[i],
                "is_last_step": out.is_last_step[i],
                "data_source": out.data_sources[i],
                "reward": out.rewards[i],
                "stop_reason": out.stop_reasons[i],
                "prompt_ids": out.prompt_token_ids[i],
                "response_ids": out.response_token_ids[i],
                "loss_mask": out.loss_masks[i],
                "prompt_text": tokenizer.decode(out.prompt_token_ids[i]),
                "response_text": tokenizer.decode(out.response_token_ids[i]),
            }
            f.write(json.dumps(row) + "\n")


def merge_rollout_metrics(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Rollout metrics of several sampling rounds: maxima as max, counts and seconds summed,
    the rest averaged (rounds have the same number of prompts)."""
    if len(rounds) == 1:
        return dict(rounds[0])
    out = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if key in r]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key in ("env/errors", "generate/seconds"):
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out


RAW_SUMS = ("compute_s", "nonfinite")
"""Worker figures reported as they are: compute seconds summed over mini-batches, and the number
of refused optimizer steps."""

LAST_VALUE_METRICS = (
    "lr",
    "grad_norm",
    "pack/micro_batch_max_tokens",
    "pack/max_micro_batch_tokens",
    "pack/fill_ratio",
    "pack/rank_token_imbalance",
)
"""Per-mini-batch figures that do not add up: the step reports the last mini-batch's."""


def _accumulate(sums: dict[str, float], metrics: dict[str, float]) -> None:
    """Add one mini-batch's (additive) metrics into the step's sums."""
    for key, value in metrics.items():
        sums[key] = value if key in LAST_VALUE_METRICS else sums.get(key, 0.0) + value
