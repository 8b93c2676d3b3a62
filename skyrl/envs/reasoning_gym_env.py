"""Any reasoning-gym dataset by name, scored by that dataset's own scorer.

Rows come from ``skyrl.data.generated.reasoning_gym_rows`` (offline, seeded);
each row's ``extras["entry"]`` is the reasoning-gym entry the scorer needs (a file row
without one is refused when the prompts load, and so is one whose dataset, ``extras["dataset"]``
or else ``environment.dataset``, is not a registered one, or whose entry that dataset's
scorer cannot score its own answer with: ``init`` checks them).
The answer is read from ``<answer>..</answer>`` (reasoning-gym's convention),
else ``#### x`` / ``\\boxed{x}``.

Some scorers raise on an answer they cannot read (``prime_factorization`` on ``abc``): such
an answer is wrong (reward 0, ``info["score_error"]`` says why), not an env error. A scorer
that raises on the entry's own answer too is broken, and raises out of ``step``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from skyrl.config.errors import ConfigError, did_you_mean
from skyrl.envs.base import Message, StepResult, TextEnv, register_env
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
        """``dataset``: a registered reasoning-gym name (None: each row's
        ``extras["dataset"]``); another raises a ``ConfigError`` keyed ``dataset``."""
        super().__init__(**kwargs)
        problem = None if dataset is None else _dataset_problem(dataset)
        if problem is not None:
            raise ConfigError("dataset", problem)
        self.dataset = dataset

    def init(
        self, prompt: str | list[Message], extras: dict[str, Any]
    ) -> tuple[list[Message], dict]:
        """The row's dataset (``extras["dataset"]``, else ``environment.dataset``) must be a
        registered one, and its ``extras["entry"]`` an entry that dataset's scorer reads (it
        scores the entry's own answer: 0.1 ms on average, 5 ms at most over reasoning-gym's
        datasets): the load check calls this for every row, so a file row naming another
        dataset or holding another entry is refused there, not at each of its steps."""
        name = extras.get("dataset") or self.dataset
        problem = (
            "the row has no extras['dataset'] and no environment.dataset is set"
            if name is None
            else _dataset_problem(name)
        )
        if problem is not None:
            raise ValueError(problem)
        assert name is not None
        entry = extras.get("entry")
        if not isinstance(entry, dict):
            raise ValueError(
                "extras['entry'] must be a reasoning-gym entry (a dict with its question, answer "
                f"and metadata), got {type(entry).__name__} {str(entry)[:60]!r}"
            )
        _check_scores_its_own_answer(_scorer(name), name, entry)
        return super().init(prompt, extras)

    def step(self, action_text: str) -> StepResult:
        entry = self.extras["entry"]
        name = self.extras.get("dataset") or self.dataset
        if name is None:  # init refuses such a row
            raise ValueError("reasoning_gym env needs environment.dataset or extras['dataset']")
        answer = extract_answer(action_text)
        scorer = _scorer(name)
        try:
            reward = float(scorer.score_answer(answer, entry))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        else:
            return StepResult([], reward, True, {"answer": answer})
        _check_scores_its_own_answer(scorer, name, entry)
        return StepResult([], 0.0, True, {"answer": answer, "score_error": error})


def _dataset_problem(dataset: object) -> str | None:
    """Why ``dataset`` names no reasoning-gym dataset (None: it names one)."""
    if not isinstance(dataset, str):
        return f"must be a reasoning-gym dataset name, got {dataset!r}"
    from reasoning_gym.factory import DATASETS

    # worded as when data.source=reasoning_gym generates its rows (skyrl.data.checked)
    if dataset not in DATASETS:
        hint = did_you_mean(dataset, sorted(DATASETS))
        return f"reasoning-gym: Dataset {dataset!r} not registered{hint}"
    try:  # the scorer (cached) is the dataset with its default config, checked by assert
        _scorer(dataset)
    except AssertionError as exc:
        return (
            f"reasoning-gym: dataset {dataset!r} cannot be generated from its default config: {exc}"
        )
    return None


def _check_scores_its_own_answer(scorer, name: str, entry: dict) -> None:
    """``ValueError`` (the row cannot be scored) unless ``scorer`` scores ``entry``'s own
    answer without raising."""
    gold = entry.get("answer") if isinstance(entry, dict) else None
    try:
        scorer.score_answer(gold, entry)
    except Exception as exc:
        problem = (
            f"reasoning-gym {name!r} score_answer fails on the entry's own answer {gold!r}: "
            f"{type(exc).__name__}: {exc}"
        )
    else:
        return
    raise ValueError(problem)  # outside the handler: no exception context
