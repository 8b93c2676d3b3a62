"""The rollout side behind one boundary: ``RolloutSource`` and its implementations."""

from skyrl.rollouts.base import RolloutSource, make_rollouts

__all__ = ["RolloutSource", "make_rollouts"]
