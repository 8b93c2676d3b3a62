"""Generators: rollout drivers (the built-in multi-turn agent loop), loss masks, step-wise or
whole-trajectory rows."""

from skyrl.generators.agent_loop import AgentLoop
from skyrl.generators.generator import (
    DRIVERS,
    Generator,
    driver_factory,
    make_generator,
    trajectories_to_output,
)
from skyrl.generators.output import GeneratorOutput, check_prefix, to_training_batch
from skyrl.generators.trajectory import (
    DriverContext,
    LoopSettings,
    RolloutDriver,
    Trajectory,
    Turn,
    VersionClock,
)

__all__ = [
    "DRIVERS",
    "AgentLoop",
    "DriverContext",
    "Generator",
    "GeneratorOutput",
    "LoopSettings",
    "RolloutDriver",
    "Trajectory",
    "Turn",
    "VersionClock",
    "check_prefix",
    "driver_factory",
    "make_generator",
    "to_training_batch",
    "trajectories_to_output",
]
