"""Advantage estimators: ``fn(inputs: AdvantageInputs, cfg) -> (advantages [B, S], returns [B, S])``.

Importing this package registers the built-ins: grpo, dr_grpo, rloo,
reinforce_pp, reinforce_pp_baseline, gae.
"""

from skyrl.algorithms.advantages import gae, grpo, reinforce_pp, rloo  # noqa: F401  (registers)
from skyrl.algorithms.advantages.compute import compute_advantages
from skyrl.algorithms.advantages.groups import broadcast_to_tokens, group_index, masked_whiten
from skyrl.algorithms.advantages.inputs import AdvantageInputs
from skyrl.algorithms.advantages.step_wise import (
    broadcast_last_step_advantages,
    trajectory_ids_from_last_steps,
)

__all__ = [
    "AdvantageInputs",
    "broadcast_last_step_advantages",
    "broadcast_to_tokens",
    "compute_advantages",
    "group_index",
    "masked_whiten",
    "trajectory_ids_from_last_steps",
]
