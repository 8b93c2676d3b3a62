"""Fault injection for the end-to-end tests, loaded through the CLI (``environment._target_``,
``imports``): NaN advantages after the first step, a policy loss that kills rank 1, and an
engine whose weight loads stall."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from skyrl.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from skyrl.envs.base import StepResult
from skyrl.envs.tool_env import ToolEnv
from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec, hf_engine_kwargs
from skyrl.inference.hf import HFEngine


@ADVANTAGE_ESTIMATORS.register("nan_after_first_step", override=True)
def nan_after_first_step(inputs, cfg):
    """GRPO at the run's first step, then NaN advantages: a non-finite loss from the driver
    side (an env's NaN reward no longer gets that far: it is an env error of its trajectory)."""
    nan_after_first_step.calls += 1  # type: ignore[attr-defined]
    advantages, returns = ADVANTAGE_ESTIMATORS.get("grpo")(inputs, cfg)
    if nan_after_first_step.calls > 1:  # type: ignore[attr-defined]
        advantages = torch.full_like(advantages, float("nan"))
    return advantages, returns


nan_after_first_step.calls = 0  # type: ignore[attr-defined]


@POLICY_LOSSES.register("die_on_rank1", override=True)
def die_on_rank1(logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg, *args):
    """Rank 1's process exits at its first loss, as an out-of-memory kill would."""
    if dist.get_rank() == 1:
        os._exit(1)
    return POLICY_LOSSES.get("ppo")(
        logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg, *args
    )


class ScriptedToolEnv(ToolEnv):
    """The real tool env, but turns 1 and 2 act as calculator calls whatever a random model
    wrote, so every trajectory has 3 turns; the last turn's reward is parity (varies). It
    speaks the tag protocol (the calls it fakes are tags), whatever ``environment.tool_format``
    (which reaches every tools env) says."""

    def __init__(self, **kwargs):
        super().__init__(**{**kwargs, "tool_format": "tags"})

    def step(self, action_text: str) -> StepResult:
        if self.tool_calls < 2:
            return super().step(f"<calculator>{self.tool_calls + 2} * 7</calculator>")
        return StepResult(observations=[], reward=float(len(action_text) % 2 == 0), done=True)


class SlowSyncHFEngine(HFEngine):
    """The hf engine, but from its ``hang_from``-th weight load on each load first sleeps
    ``hang_s`` seconds, as an engine stuck in a sync would."""

    def __init__(self, *args, hang_from: int, hang_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.loads, self.hang_from, self.hang_s = 0, hang_from, hang_s

    def update_weights(self, weights) -> None:
        self.loads += 1
        if self.loads >= self.hang_from:
            time.sleep(self.hang_s)
        super().update_weights(weights)


@ENGINE_BACKENDS.register("slow_sync_hf", override=True)
def slow_sync_hf(cfg, model_path, tokenizer_path):
    """``generator.backend=slow_sync_hf``: loads from the ``$HANG_SYNC_FROM``-th on take
    ``$HANG_SYNC_S`` seconds longer."""
    kwargs = hf_engine_kwargs(cfg, model_path, tokenizer_path)
    hang = {
        "hang_from": int(os.environ["HANG_SYNC_FROM"]),
        "hang_s": float(os.environ["HANG_SYNC_S"]),
    }
    return EngineSpec(SlowSyncHFEngine, {**kwargs, **hang})
