"""skyrl: RL post-training for language models. ``skyrl.compose`` + ``skyrl.train`` from Python,
``skyrl-train`` from the command line.

The API is imported on first use, so worker processes that only need ``skyrl.workers``
(and never the Hydra composition in ``skyrl.api``) do not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl.api import TrainResult, compose, train

__all__ = ["TrainResult", "compose", "train"]


def __getattr__(name: str):
    if name in __all__:
        from skyrl import api

        return getattr(api, name)
    raise AttributeError(f"module 'skyrl' has no attribute {name!r}")
