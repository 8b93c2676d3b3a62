"""The RL loop: generate, score, reference/old logprobs, advantages, train, sync, log.

``RLTrainer.train`` reads like the algorithm; each stage is one method. The
mini-batches of a step are cut in PROMPT units, so a step always takes
``train_batch_size / policy_mini_batch_size * update_epochs_per_batch``
optimizer steps, whatever the number of turns.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from pathlib import Path

import torch

from skyrl.algorithms import compute_advantages, compute_loss_weights, finalize_metrics
from skyrl.algorithms.advantages import AdvantageInputs
from skyrl.algorithms.advantages.step_wise import broadcast_last_step_advantages
from skyrl.algorithms.kl import masked_kl
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.config.root import SkyRLConfig
from skyrl.data import PromptRow, load_prompts
from skyrl.dispatch import MeshDispatch
from skyrl.models.resolve import resolve_model_path
from skyrl.trainer.plan import make_plan


class RLTrainer:
    """Owns the engine, the generator and the worker groups of one run."""

    def __init__(self, cfg: SkyRLConfig, output_dir: Path):
        from transformers import AutoTokenizer

        from skyrl.generators import make_generator
        from skyrl.inference.factory import make_engine
        from skyrl.workers.group import WorkerGroup

        model_path = resolve_model_path(cfg.model.path)
        self.cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=model_path))
        self.output_dir = output_dir
        self.plan = make_plan(self.cfg)
        self.fake = cfg.data.source == "fake"  # random rollouts, no engine: the trainer path alone
        self.train_rows = [] if self.fake else load_prompts(cfg.data, cfg.environment, "train")
        per_epoch = cfg.data.num_train_prompts if self.fake else len(self.train_rows)
        self.total_steps = self.plan.total_steps or cfg.trainer.epochs * (
            per_epoch // cfg.trainer.train_batch_size
        )
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or model_path)
        self.engine = (
            None if self.fake else make_engine(cfg.generator, model_path, cfg.model.tokenizer_path)
        )
        self.generator = (
            None
            if self.fake
            else make_generator(cfg.generator, cfg.environment, self.engine, self.tokenizer)
        )
        optimizer_steps = self.total_steps * self.plan.optimizer_steps_per_step
        self.policy = WorkerGroup("policy", self.cfg, optimizer_steps)
        colocate = self.policy if cfg.trainer.colocate_policy_ref else None
        self.reference = (
            WorkerGroup("reference", self.cfg, optimizer_steps, colocate)
            if cfg.algorithm.uses_reference
            else None
        )
        self.critic = (
            WorkerGroup("critic", self.cfg, optimizer_steps) if cfg.algorithm.uses_critic else None
        )
        self.history: list[dict[str, float]] = []

    # -- the loop --------------------------------------------------------------------

    def train(self) -> list[dict[str, float]]:
        """Run every step; returns the metrics history (one dict per step)."""
        for step in range(1, self.total_steps + 1):
            started = time.perf_counter()
            batch, metrics = (
                self.fake_rollouts(step) if self.fake else self.generate(self.sample_prompts(step))
            )
            batch = self.add_logprobs_and_values(batch)
            batch = self.add_advantages(batch)
            metrics.update(self.train_on(batch))
            metrics.update(self.sync_weights())
            metrics["timing/step_s"] = time.perf_counter() - started
            self.log(step, metrics)
        return self.history

    def sample_prompts(self, step: int) -> list[PromptRow]:
        """The step's prompts: a seeded shuffle per epoch, independent copies, unique uids."""
        n = self.cfg.trainer.train_batch_size
        per_epoch = len(self.train_rows) // n
        epoch, index = divmod(step - 1, per_epoch)
        order = list(range(len(self.train_rows)))
        random.Random(self.cfg.trainer.seed + epoch).shuffle(order)
        picked = order[index * n : (index + 1) * n]
        return [
            dataclasses.replace(copy.deepcopy(self.train_rows[i]), uid=f"s{step}p{j}")
            for j, i in enumerate(picked)
        ]

    def generate(self, rows: list[PromptRow]) -> tuple[TrainingInputBatch, dict[str, float]]:
        """Rollouts of every prompt, as a training batch plus rollout metrics."""
        from skyrl.generators import to_training_batch
        from skyrl.inference.base import SamplingParams

        g = self.cfg.generator
        sampling = SamplingParams.from_config(
            g.sampling, n=g.n_samples_per_prompt, max_tokens=g.max_generate_length
        )
        output = self.generator.generate(rows, g.n_samples_per_prompt, sampling)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return to_training_batch(output, pad_id), dict(output.metrics)

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

    def add_logprobs_and_values(self, batch: TrainingInputBatch) -> TrainingInputBatch:
        """Old policy logprobs, reference logprobs and critic values via the workers' forward."""
        staged = self._stage(batch, loss_weights=False)
        mask = batch.loss_mask
        fields = {"old_logprobs": self.policy.forward(staged, len(batch)) * mask}
        if self.reference is not None:
            fields["ref_logprobs"] = self.reference.forward(staged, len(batch)) * mask
        if self.critic is not None:
            fields["values"] = self.critic.forward(staged, len(batch)) * mask
        return batch.replace(**fields)

    def add_advantages(self, batch: TrainingInputBatch) -> TrainingInputBatch:
        """Advantages (and returns) from the registered estimator; step-wise broadcast."""
        a = self.cfg.algorithm
        token_rewards = None
        if a.use_kl_in_reward:
            kl = masked_kl(a.kl_estimator, batch.old_logprobs, batch.ref_logprobs, batch.loss_mask)
            token_rewards = -a.init_kl_coef * kl
        inputs = AdvantageInputs(
            batch.rewards, batch.loss_mask, batch.metadata["uids"], batch.values, token_rewards
        )
        if self.cfg.generator.step_wise:
            adv, ret = broadcast_last_step_advantages(
                inputs, a, batch.metadata["is_last_step"], batch.metadata.get("trajectory_ids")
            )
        else:
            adv, ret = compute_advantages(inputs, a)
        return batch.replace(advantages=adv, returns=ret)

    def train_on(self, batch: TrainingInputBatch) -> dict[str, float]:
        """``update_epochs_per_batch`` passes over the prompt-unit mini-batches (critic first)."""
        sums: dict[str, dict[str, float]] = {"critic": {}, "policy": {}}
        staged = self._stage(batch, loss_weights=True)  # the same chunks serve every epoch
        for _ in range(self.cfg.trainer.update_epochs_per_batch):
            for chunks in staged:
                if self.critic is not None:
                    _accumulate(sums["critic"], self.critic.train_mini_batch(chunks))
                _accumulate(
                    sums["policy"], {**self.policy.train_mini_batch(chunks), "optimizer_steps": 1.0}
                )
        out = {}
        for role, role_sums in sums.items():
            packing = {k: v for k, v in role_sums.items() if k.startswith("pack/")}
            losses = {k: v for k, v in role_sums.items() if not k.startswith("pack/")}
            out.update(
                {
                    f"{role}/{k}": v
                    for k, v in {**finalize_metrics(losses), **packing}.items()
                    if role_sums
                }
            )
        return out

    def sync_weights(self) -> dict[str, float]:
        """Policy weights (rank 0's gathered copy) into the inference engine."""
        if self.engine is None:
            return {}
        started = time.perf_counter()
        self.engine.update_weights(self.policy.run("state_dict_for_sync")[0])
        self.engine.reset_prefix_cache()
        return {"timing/sync_s": time.perf_counter() - started}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """One console line per step and one jsonl record."""
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(record)
        with open(self.output_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        reward = metrics.get("generate/reward_mean", float("nan"))
        print(
            f"step {step}/{self.total_steps}  reward {reward:.3f}  step {metrics['timing/step_s']:.1f}s",
            flush=True,
        )

    def export(self) -> Path:
        """The final policy as a ``from_pretrained`` directory."""
        out = self.output_dir / "final_hf"
        self.policy.run("export_hf", str(out), self.cfg.model.tokenizer_path or self.cfg.model.path)
        return out

    def shutdown(self) -> None:
        for group in (self.critic, self.reference, self.policy):
            if group is not None:
                group.shutdown()

    # -- helpers ---------------------------------------------------------------------

    def _stage(self, batch: TrainingInputBatch, loss_weights: bool):
        t, g, a = self.cfg.trainer, self.cfg.generator, self.cfg.algorithm
        uids = batch.metadata["uids"]
        bounds = compute_prompt_mini_batch_boundaries(
            uids, t.policy_mini_batch_size, t.train_batch_size, step_wise=g.step_wise
        )
        weights_fn = None
        if loss_weights:

            def weights_fn(mini: TrainingInputBatch) -> torch.Tensor:
                return compute_loss_weights(
                    a.loss_reduction, mini.loss_mask, mini.metadata["uids"], g.max_seq_len
                )

        return MeshDispatch.stage_chunks(t.dp_size, batch, bounds, loss_weights_fn=weights_fn)


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
