"""``data=fake``: random token rollouts with random 0/1 rewards, no engine.

The trainer runs its whole path afterwards (logprobs, advantages, training,
checkpoints), so it can be tested and benchmarked without an inference engine.
Every row is stamped with the policy version the source was last told.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch

from skyrl.batch import TrainingInputBatch
from skyrl.config.root import SkyRLConfig
from skyrl.inference.client import EngineClient
from skyrl.rollouts.base import set_version_after
from skyrl.tracking import metric_names as names
from skyrl.workers.fake_rollouts import fake_rollouts


class FakeRollouts:
    """``trainer.train_batch_size`` random prompt groups per step (``skyrl.workers.fake_rollouts``)."""

    def __init__(self, cfg: SkyRLConfig, tokenizer):
        self.cfg = cfg
        self.vocab_size = len(tokenizer)
        self.batches_per_epoch = cfg.data.num_train_prompts // cfg.trainer.train_batch_size
        self.current = 0
        """Policy version the rows are stamped with."""
        self.engine: EngineClient | None = None
        """No engine: nothing to generate with or sync into."""

    def next_batch(self, step: int) -> tuple[TrainingInputBatch, dict[str, float]]:
        g = self.cfg.generator
        batch = fake_rollouts(
            num_prompts=self.cfg.trainer.train_batch_size,
            n_samples_per_prompt=g.n_samples_per_prompt,
            vocab_size=self.vocab_size,
            prompt_len=(1, min(g.max_prompt_length, g.max_seq_len - 1)),
            response_len_mean=g.max_generate_length / 2,
            max_seq_len=g.max_seq_len,
            seed=self.cfg.data.seed + step,
            step_wise=g.step_wise,
            max_turns=g.max_turns,
        )
        batch.metadata["policy_versions"] = [
            [(self.current, self.current)] for _ in range(len(batch))
        ]
        # generated tokens per trajectory: loss tokens summed over its rows (turns)
        tokens = batch.loss_mask.sum(dim=1).tolist()
        per_trajectory: dict[str, float] = {}
        for tid, n in zip(batch.metadata["trajectory_ids"], tokens, strict=True):
            per_trajectory[tid] = per_trajectory.get(tid, 0.0) + n
        # a trajectory's reward is on its last row (a step-wise trajectory's others hold 0)
        rewards = batch.require("rewards")[torch.tensor(batch.metadata["is_last_step"])]
        return batch, {
            names.REWARD: float(rewards.mean()),
            names.RESPONSE_LENGTH: sum(per_trajectory.values()) / max(1, len(per_trajectory)),
        }

    def updating_weights(
        self, version: int, timeout_s: float | None = None
    ) -> AbstractContextManager[None]:
        return set_version_after(self, version)

    def close(self) -> None:
        pass

    def has_eval(self) -> bool:
        return False

    def evaluate(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Nothing: a step's fake batch depends only on the step."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
