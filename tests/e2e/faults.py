"""Fault injection for the end-to-end tests, loaded through the CLI (``environment._target_``,
``imports``): NaN rewards after a number of trajectories, and a policy loss that kills rank 1."""

from __future__ import annotations

import os

import torch.distributed as dist

from skyrl.algorithms import POLICY_LOSSES
from skyrl.envs.base import StepResult, TextEnv
from skyrl.envs.tool_env import ToolEnv


class NaNAfterEnv(TextEnv):
    """Parity reward for the first ``$NAN_AFTER`` trajectories of the process, then NaN."""

    started = 0

    def step(self, action_text: str) -> StepResult:
        NaNAfterEnv.started += 1
        poisoned = NaNAfterEnv.started > int(os.environ["NAN_AFTER"])
        reward = float("nan") if poisoned else float(len(action_text) % 2 == 0)
        return StepResult(observations=[], reward=reward, done=True)


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
    wrote, so every trajectory has 3 turns; the last turn's reward is parity (varies)."""

    def step(self, action_text: str) -> StepResult:
        if self.tool_calls < 2:
            return super().step(f"<calculator>{self.tool_calls + 2} * 7</calculator>")
        return StepResult(observations=[], reward=float(len(action_text) % 2 == 0), done=True)
