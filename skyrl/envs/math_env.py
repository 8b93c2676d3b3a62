"""Single-turn math: the reply's final answer (``#### x`` or ``\\boxed{x}``) graded against the
row's ``answer`` by :func:`skyrl.envs.grading.grade`.

A plain-number gold (``28``, ``2.5``) takes only a plain number of the same value, a word gold
(``yes``, ``\\text{even}``) the same words, and anything else goes to math-verify, read as
grading's module docstring says: decimals are exact fractions (``0.5000001`` is not
``\\frac{1}{2}``; a lone decimal matches an irrational gold within a relative 1e-9), units count
when both sides have one (``5\\text{ m}`` is not ``5\\text{ cm}``; a bare ``5`` still matches
it), an inequality matches the interval it describes (``x<3``, ``(-\\infty,3)``), E-notation
is a number (``1.0e-3``), a percent sign on one side is read as its number and as its value
over 100 (``10\\%`` takes ``10`` and ``0.1``; ``15\\%`` matches a plain-number gold ``0.15``),
and a repeating decimal is its fraction (``0.\\overline{3}`` is ``\\frac{1}{3}``).
"""

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
