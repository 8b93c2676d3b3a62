"""Schema of the ``environment`` group: which text environment scores rollouts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skyrl.config.errors import require


def tool_deadline_problem(tool_timeout_s: float, timeout_s: float) -> str | None:
    """Why a tools env cannot run with these limits (None when it can): the calls of one
    reply share the env step's limit, so one call's limit must be below it."""
    if tool_timeout_s < timeout_s:
        return None
    return (
        f"must be < environment.timeout_s ({timeout_s:g}), which limits a whole env step "
        f"(all its tool calls); got {tool_timeout_s:g}"
    )


@dataclass
class EnvironmentConfig:
    """A registered environment by ``name``, or a user class by ``_target_``."""

    name: str = "math"
    """Registered environment name (math, reasoning_gym, tools, ...)."""
    _target_: str | None = None
    """Import path of a user environment class; overrides ``name``."""
    dataset: str | None = None
    """reasoning_gym: the reasoning-gym dataset name."""
    timeout_s: float = 10.0
    """Per-call time limit of env.step / the reward function, in seconds."""
    max_observation_chars: int = 2048
    """Tool output longer than this is truncated, in characters."""
    tool_timeout_s: float = 5.0
    """tools (``tools`` or any ``ToolEnv`` subclass, by name or ``_target_``; the same holds
    for every ``tool_*`` key): wall-clock limit of one Python tool call, in seconds; below
    ``timeout_s``. The calls of one reply share a deadline a margin (1 s, at most a tenth) before ``timeout_s``:
    each gets this or what is left, and those past it are not run."""
    tool_memory_bytes: int = 512 * 1024 * 1024
    """tools: address-space limit of the Python tool subprocess, in bytes."""
    tool_format: str = "auto"
    """tools: how the model calls tools. ``native``: calculator and python declared as
    JSON-schema tools through the chat template, calls parsed from the model's own format
    (``generator.tool_parser``); ``tags``: the ``<calculator>...</calculator>`` text
    protocol; ``auto``: native when the chat template renders tools and the parser loads,
    else tags (the choice is logged)."""
    max_concurrent_calls: int = 32
    """Env calls (the constructor, init, step, close) that may run at once over all trajectories in flight,
    each on a thread of its own; a call's ``timeout_s`` starts when it gets one of these."""
    max_hung_calls: int = 128
    """Timed-out env calls whose threads may still be running (Python cannot stop a thread;
    a hung call no longer counts against ``max_concurrent_calls``) before the run stops
    with an error."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the environment's constructor."""

    def __post_init__(self) -> None:
        require(bool(self.name) or bool(self._target_), "name", "set a registered name or _target_")
        require(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        require(
            self.tool_timeout_s > 0, "tool_timeout_s", f"must be > 0, got {self.tool_timeout_s}"
        )
        require(
            self.tool_memory_bytes >= 16 << 20,
            "tool_memory_bytes",
            f"must be >= 16 MiB, got {self.tool_memory_bytes}",
        )
        require(
            self.tool_format in ("auto", "native", "tags"),
            "tool_format",
            f"must be auto, native or tags, got {self.tool_format!r}",
        )
        if self.name == "tools" and not self._target_:  # other tools envs: when built
            problem = tool_deadline_problem(self.tool_timeout_s, self.timeout_s)
            require(problem is None, "tool_timeout_s", problem or "")
        if self.name == "reasoning_gym" and not self._target_:
            require(
                self.dataset is not None,
                "dataset",
                "environment=reasoning_gym needs a reasoning-gym dataset name, e.g. basic_arithmetic",
            )
        require(
            self.max_concurrent_calls >= 1,
            "max_concurrent_calls",
            f"must be >= 1, got {self.max_concurrent_calls}",
        )
        require(
            self.max_hung_calls >= 0, "max_hung_calls", f"must be >= 0, got {self.max_hung_calls}"
        )
        require(
            self.max_observation_chars >= 1,
            "max_observation_chars",
            f"must be >= 1, got {self.max_observation_chars}",
        )
