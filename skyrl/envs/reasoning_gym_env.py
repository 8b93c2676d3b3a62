"""Any reasoning-gym dataset by name, scored by that dataset's own scorer.

Rows come from ``skyrl.data.generated.reasoning_gym_rows`` (offline, seeded);
each row's ``extras["entry"]`` is the reasoning-gym entry the scorer needs (a file row
without one is refused when the prompts load).
The answer is read from ``<answer>..</answer>`` (reasoning-gym's convention),
else ``#### x`` / ``\\boxed{x}``.
"""

from __future__ import annotations

from functools import cache

from skyrl.envs.base import StepResult, TextEnv, register_env
from skyrl.envs.grading import extract_answer


@cache
def _scorer(dataset: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(dataset, size=1, seed=0)


@register_env("reasoning_gym")
class ReasoningGymEnv(TextEnv):
    """Single turn; reward = the dataset's ``score_answer`` in [0, 1]."""

    required_extras = ("entry",)

    def __init__(self, dataset: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.dataset = dataset

    def step(self, action_text: str) -> StepResult:
        entry = self.extras["entry"]
        name = self.extras.get("dataset") or self.dataset
        if name is None:
            raise ValueError("reasoning_gym env needs environment.dataset or extras['dataset']")
        answer = extract_answer(action_text)
        reward = float(_scorer(name).score_answer(answer, entry))
        return StepResult([], reward, True, {"answer": answer})
