"""Importing this module registers the built-in environments."""

from skyrl.envs import math_env, reasoning_gym_env, tool_env  # noqa: F401
