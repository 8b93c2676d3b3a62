"""A test environment whose reward varies with the sampled text, so GRPO groups
have non-zero advantages even for a random tiny model."""

from __future__ import annotations

from skyrl.envs.base import StepResult, TextEnv


class ParityEnv(TextEnv):
    """Reward 1 when the response has an even number of characters, else 0; one turn."""

    def step(self, action_text: str) -> StepResult:
        return StepResult(observations=[], reward=float(len(action_text) % 2 == 0), done=True)


class VowelEnv(TextEnv):
    """Reward: the share of the response's letters that are vowels (0 without letters); one
    turn. A random tiny model learns it within a few steps (it only has to prefer some
    tokens), so a run whose reward rises is a run that trains."""

    def step(self, action_text: str) -> StepResult:
        letters = [c for c in action_text.lower() if c.isalpha()]
        vowels = sum(c in "aeiou" for c in letters)
        return StepResult(
            observations=[], reward=vowels / len(letters) if letters else 0.0, done=True
        )
