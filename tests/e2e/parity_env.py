"""A test environment whose reward varies with the sampled text, so GRPO groups
have non-zero advantages even for a random tiny model."""

from __future__ import annotations

from skyrl.envs.base import StepResult, TextEnv


class ParityEnv(TextEnv):
    """Reward 1 when the response has an even number of characters, else 0; one turn."""

    def step(self, action_text: str) -> StepResult:
        return StepResult(observations=[], reward=float(len(action_text) % 2 == 0), done=True)
