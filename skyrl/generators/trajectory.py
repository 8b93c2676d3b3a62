"""What a rollout driver produces (``Trajectory`` of ``Turn``s) and what it is given.

A rollout driver (``generator.agent``) runs every sample of a list of prompt rows
against the engine, one ``await engine.generate`` per LLM turn, and returns one
``Trajectory`` per (row, sample) in (row, sample) order. The built-in driver is
``skyrl.generators.agent_loop.AgentLoop`` (our ``TextEnv`` loop); another one
(an external harness, say) is any callable ``(DriverContext) -> RolloutDriver``
named by its import path. ``skyrl.generators.generator.Generator`` turns the
trajectories into training rows; the trainer never sees the driver.

Policy versions are data: each turn records the policy version of the engine's
weights when its request was dispatched and when it finished (``VersionClock``
is advanced by the rollout source when the trainer syncs new weights). In a
synchronous run both equal the step's version for every turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import InferenceEngine, SamplingParams

if TYPE_CHECKING:
    from skyrl.config.generator import GeneratorConfig
    from skyrl.envs.base import TextEnv


@dataclass
class VersionClock:
    """The policy version of the weights the engines hold: the number of weight syncs so far
    (step ``s`` of a synchronous run generates at version ``s - 1``)."""

    current: int = 0
    gate: asyncio.Event | None = None
    """Set while requests may be dispatched; an asynchronous source clears it while the
    weights change (None: always open)."""

    async def dispatch_version(self) -> int:
        """Wait until a request may be sent and return the version it is dispatched at."""
        if self.gate is not None:
            await self.gate.wait()
        return self.current


@dataclass
class Turn:
    """One LLM call of a trajectory."""

    prompt_ids: list[int]
    """Full context given to the engine."""
    response_ids: list[int]
    """Tokens the engine sampled."""
    logprobs: list[float]
    """Their logprobs (``skyrl.inference.base``'s convention)."""
    finish_reason: str
    """Engine finish reason: stop / length."""
    appended_ids: list[int] = field(default_factory=list)
    """Tokens appended after this turn (the template's turn end, or what the reply left of
    it; observations; the next generation prompt)."""
    version_dispatched: int = 0
    """Policy version when the request was sent."""
    version_finished: int = 0
    """Policy version when the completion came back."""
    dispatched_at: float = 0.0
    """``time.monotonic()`` when the request was sent."""
    finished_at: float = 0.0
    """``time.monotonic()`` when the completion came back."""
    fork: str = ""
    """Why this turn's prompt does not extend the previous turn's prompt + response +
    appended tokens (``""``: it does). A forked turn starts a new training row."""


@dataclass
class Trajectory:
    """A finished rollout of one sample of one prompt."""

    row: PromptRow
    trajectory_id: str
    turns: list[Turn]
    reward: float
    stop_reason: str
    env_errors: int = 0
    counts: dict[str, float] = field(default_factory=dict)
    """Driver-specific counts, summed over the step's trajectories into its metrics (an
    external agent's ``agent/forks``, ...)."""


@dataclass
class LoopSettings:
    """What the built-in loop needs from the ``generator`` / ``environment`` config."""

    max_prompt_length: int
    max_generate_length: int
    max_turns: int
    env_timeout_s: float = 10.0
    max_tokens_per_turn: int | None = None
    max_env_calls: int = 32
    """Env calls that may run at once (``environment.max_concurrent_calls``)."""
    max_hung_env_calls: int = 128
    """Timed-out env calls that may still be running (``environment.max_hung_calls``)."""


@dataclass
class DriverContext:
    """Everything a rollout driver is built from."""

    engine: InferenceEngine
    tokenizer: object
    """A transformers tokenizer with a chat template."""
    env_factory: Callable[[], TextEnv]
    settings: LoopSettings
    clock: VersionClock
    config: GeneratorConfig | None = None
    """The whole ``generator`` group, for drivers that need more than ``settings``."""


class RolloutDriver(Protocol):
    """Runs the trajectories of a list of prompt rows."""

    async def run(
        self, rows: list[PromptRow], n_samples: int, sampling: SamplingParams
    ) -> list[Trajectory]:
        """``n_samples`` trajectories per row, in (row, sample) order. ``sampling.seed`` is
        the base seed of this call (per-request seeds: ``request_seed``)."""
        ...


DriverFactory = Callable[[DriverContext], RolloutDriver]
"""What ``generator.agent`` names: builds a driver from the context."""
