"""Single-turn math: the reply's final answer (``#### x`` or ``\\boxed{x}``) graded by math-verify."""

from __future__ import annotations

from skyrl.envs.base import StepResult, TextEnv, register_env
from skyrl.envs.grading import extract_answer, grade


@register_env("math")
class MathEnv(TextEnv):
    """Reward 1 when the answer equals ``extras["answer"]``; one turn."""

    required_extras = ("answer",)

    def step(self, action_text: str) -> StepResult:
        gold = self.extras["answer"]
        reward = grade(action_text, gold)
        return StepResult([], reward, True, {"answer": extract_answer(action_text)})
