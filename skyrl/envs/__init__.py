"""Text environments: interface, registry, and built-ins (math, reasoning_gym, tools)."""

from skyrl.envs.base import (
    ENV_REGISTRY,
    StepResult,
    TextEnv,
    env_class,
    make_checked_env,
    make_env_factory,
    register_env,
)

__all__ = [
    "ENV_REGISTRY",
    "StepResult",
    "TextEnv",
    "env_class",
    "make_checked_env",
    "make_env_factory",
    "register_env",
]
