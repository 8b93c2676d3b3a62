"""Generators: the multi-turn agent loop, loss masks, step-wise or whole-trajectory rows."""

from skyrl.generators.agent_loop import (
    AgentLoop,
    Generator,
    LoopSettings,
    Trajectory,
    make_generator,
)
from skyrl.generators.output import GeneratorOutput, check_prefix, to_training_batch

__all__ = [
    "AgentLoop",
    "Generator",
    "GeneratorOutput",
    "LoopSettings",
    "Trajectory",
    "check_prefix",
    "make_generator",
    "to_training_batch",
]
