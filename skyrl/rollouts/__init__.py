"""The rollout side behind one boundary: ``RolloutSource`` and its implementations."""

from skyrl.rollouts.base import RolloutSource, WeightSyncTimeout, make_rollouts

__all__ = ["RolloutSource", "WeightSyncTimeout", "make_rollouts"]
