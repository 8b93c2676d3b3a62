"""skyrl: RL post-training for language models. ``skyrl.compose`` + ``skyrl.train`` (and
``skyrl.evaluate``) from Python, ``skyrl-train`` (and ``skyrl-eval``) from the command line.

The API is imported on first use, so worker processes that only need ``skyrl.workers``
(and never the Hydra composition in ``skyrl.api``) do not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl.api import TrainResult, compose, train
    from skyrl.eval_cli import EvalResult, evaluate

__all__ = ["EvalResult", "TrainResult", "compose", "evaluate", "train"]


def __getattr__(name: str):
    if name in ("EvalResult", "evaluate"):
        from skyrl import eval_cli

        return getattr(eval_cli, name)
    if name in __all__:
        from skyrl import api

        return getattr(api, name)
    raise AttributeError(f"module 'skyrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the API's, imported on first use (``__getattr__``): tab
    completion lists ``skyrl.train`` before it is imported."""
    return sorted({*globals(), *__all__})
