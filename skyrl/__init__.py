"""skyrl: RL post-training for language models. ``skyrl.compose`` + ``skyrl.train`` from Python,
``skyrl-train`` from the command line."""

from skyrl.api import TrainResult, compose, train

__all__ = ["TrainResult", "compose", "train"]
