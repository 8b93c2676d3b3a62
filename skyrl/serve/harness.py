"""Training an external agent: ``generator.agent`` naming ``async def rollout(client, row)``.

The agent is the user's own code written against the OpenAI API. For every
trajectory (prompt row x sample) the driver opens a session on an
OpenAI-compatible endpoint it runs on 127.0.0.1 (``skyrl.serve.backend``) and
calls ``rollout(client, row)`` with an ``openai.AsyncOpenAI`` client whose API
key is that session's. The model is served as ``policy`` (``client.models.list()``
says so). What the agent's requests sampled is recorded exactly and turned into
training rows by ``skyrl.serve.reconcile``.

The reward is what ``rollout`` returns, or, with ``generator.agent_reward_fn``,
``reward_fn(row, messages)`` of the conversation (the last request's messages
and the reply; a ``/v1/completions`` request sends none, so its reply alone, the text as
content): any real number (a ``numpy`` scalar, a bool) is taken as a float. An agent
that raises, returns no number (or not a finite one, or one beyond float32's range,
``REWARD_MAX``, as the built-in loop's ``checked_step``; a ``CancelledError`` of its own
code too, where nothing cancelled the rollout), or runs past
``generator.agent_timeout_s`` gets reward 0 and counts in ``env/errors``; its
requests so far still train. All trajectories of a step run concurrently.

The eval pass (``skyrl.rollouts.evaluation``) runs its trajectories the same way, in
eval sessions: served with ``generator.eval_sampling`` whatever the agent asks (nothing
trains on them, so the training-sampling rule does not apply); a failure counts in
``eval/env_errors``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from skyrl.config.errors import ConfigError, exception_line
from skyrl.data.prompts import PromptRow
from skyrl.generators.agent_loop import REWARD_MAX
from skyrl.generators.trajectory import DriverContext, Trajectory
from skyrl.inference.base import SamplingParams
from skyrl.registry import import_path
from skyrl.rollouts.evaluation import is_eval_row
from skyrl.serve.backend import EngineBinding, Limits, OpenAIBackend, Session
from skyrl.serve.reconcile import fork_counts, to_turns

logger = logging.getLogger(__name__)

POLICY_MODEL = "policy"
"""The model id the endpoint serves the policy under during training."""

Rollout = Callable[[Any, PromptRow], Awaitable[Any]]


def prompt_messages(row: PromptRow) -> list[dict]:
    """A row's prompt as chat messages (a text prompt is one user message)."""
    if isinstance(row.prompt, str):
        return [{"role": "user", "content": row.prompt}]
    return [dict(m) for m in row.prompt]


def is_external_agent(name: str) -> bool:
    """Whether ``generator.agent`` names an external agent (a coroutine function)."""
    import inspect

    if "." not in name:
        return False
    try:
        return inspect.iscoroutinefunction(import_path(name))
    except ValueError:
        return False


def check_external_agent(cfg) -> None:
    """What training an external agent needs from the rest of the config: its reward
    function imports, and an outcome estimator (a session can fork into several rows, which
    share their trajectory's advantage as step-wise rows do)."""
    from skyrl.config.validate import STEP_WISE_INCOMPATIBLE_ESTIMATORS

    g = cfg.generator
    if g.agent_reward_fn:
        reward_function(g.agent_reward_fn)
    estimator = cfg.algorithm.advantage_estimator
    if estimator in STEP_WISE_INCOMPATIBLE_ESTIMATORS:
        raise ConfigError(
            "algorithm.advantage_estimator",
            f"{estimator!r} cannot train an external agent (generator.agent={g.agent}): its "
            "sessions can fork into several rows; use an outcome estimator such as grpo or rloo",
        )


def reward_function(path: str) -> Callable[[PromptRow, list[dict]], float]:
    """The ``generator.agent_reward_fn`` callable (``ConfigError`` when it does not import)."""
    try:
        return import_path(path)
    except ValueError as exc:
        problem = str(exc)
    except Exception as exc:  # the module was found but raised (its own bug, a syntax error)
        problem = f"importing {path!r} raised {exception_line(exc)}"
    raise ConfigError("generator.agent_reward_fn", problem)


def _cancelled() -> bool:
    """Whether the running task was asked to stop (``Task.cancelling``, Python 3.11+; before
    it, a CancelledError counts as a request to stop)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


class HarnessDriver:
    """Runs an external agent's trajectories through the endpoint (module docstring)."""

    def __init__(
        self,
        ctx: DriverContext,
        rollout: Rollout,
        timeout_s: float = 300.0,
        reward_fn: Callable[[PromptRow, list[dict]], float] | None = None,
        drift: str = "error",
        tool_parser: str = "hermes",
    ):
        s = ctx.settings
        self.ctx = ctx
        self.rollout = rollout
        self.timeout_s = timeout_s
        self.reward_fn = reward_fn
        self.drift = drift
        limits = Limits(s.max_prompt_length, s.max_generate_length, s.max_tokens_per_turn)
        self.backend = OpenAIBackend(
            ctx.tokenizer, [POLICY_MODEL], limits, binding=None, tool_parser=tool_parser,
            max_requests=s.max_turns,
        )  # fmt: skip
        self.server: Any = None
        # the agents' clients (openai's, over httpx) log a line per request at INFO, the level
        # a run logs at: dozens per step in the console and cli.log; a level set stays
        http_log = logging.getLogger("httpx")
        if http_log.level == logging.NOTSET:
            http_log.setLevel(logging.WARNING)

    @classmethod
    def from_context(cls, ctx: DriverContext, rollout: Rollout) -> HarnessDriver:
        """The factory ``generator.agent`` gets when it names a coroutine function."""
        g = ctx.config
        if g is None:
            return cls(ctx, rollout)
        reward_fn = reward_function(g.agent_reward_fn) if g.agent_reward_fn else None
        return cls(
            ctx, rollout, g.agent_timeout_s, reward_fn, g.agent_sampling_drift, g.tool_parser
        )

    @property
    def base_url(self) -> str:
        """The endpoint's URL, started on first use."""
        if self.server is None:
            from skyrl.serve.app import HTTPServer, build_app

            server = HTTPServer(build_app(self.backend), "127.0.0.1", 0)
            server.start()
            self.server = server
        return self.server.base_url

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    async def run(
        self, rows: list[PromptRow], n_samples: int, sampling: SamplingParams
    ) -> list[Trajectory]:
        import httpx

        url = self.base_url
        binding = EngineBinding(self.ctx.engine, self.ctx.clock, asyncio.get_running_loop())
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=self.timeout_s + 30) as http:
            return list(
                await asyncio.gather(
                    *(
                        self._trajectory(url, http, binding, row.for_sample(), k, sampling)
                        for row in rows
                        for k in range(n_samples)
                    )
                )
            )

    async def _trajectory(self, url, http, binding, row, sample, sampling) -> Trajectory:
        import openai

        session = self.backend.sessions.open(
            Session(row, sample, sampling, binding, drift=self.drift, evaluating=is_eval_row(row))
        )
        client = openai.AsyncOpenAI(
            base_url=url, api_key=session.key, http_client=http, max_retries=0
        )
        error: str | None = None
        reward = 0.0
        try:
            result = await asyncio.wait_for(self.rollout(client, row), self.timeout_s)
            reward = self._reward(row, session, result)
        except asyncio.TimeoutError:
            error = f"timed out after generator.agent_timeout_s={self.timeout_s:g} s"
        except Exception as exc:  # the agent's own bug or bad output: this trajectory only
            error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        except asyncio.CancelledError:
            if _cancelled():  # the rollout itself is stopped (Ctrl-C, the step's end)
                raise
            # the agent's own (a task of its own cancelled and awaited): as any error of it
            error = "CancelledError: the agent raised it, nothing cancelled its rollout"
        finally:
            self.backend.sessions.close(session)
        records = list(session.records)
        counts = fork_counts(session.chain) if session.chain is not None else {}
        counts["agent/sampling_overrides"] = float(session.sampling_overrides)
        if error is not None:
            logger.warning("agent trajectory %s: %s (reward 0)", session.trajectory_id, error)
            return Trajectory(
                row, session.trajectory_id, to_turns(records), 0.0, "env_error", 1, counts
            )
        stop = "length" if records and records[-1].finish_reason == "length" else "stop"
        return Trajectory(row, session.trajectory_id, to_turns(records), reward, stop, 0, counts)

    def _reward(self, row: PromptRow, session: Session, result: Any) -> float:
        if self.reward_fn is not None:
            last = session.records[-1] if session.records else None
            messages = (last.messages + [last.reply]) if last is not None else []
            result = self.reward_fn(row, messages)
            source = "generator.agent_reward_fn"
        else:
            source = "the agent"
        # any real number (numpy's, a bool, numpy's bool) as the built-in loop's
        # float(StepResult.reward); numpy's bool is no numbers.Real, so it is named
        if not isinstance(result, (numbers.Real, np.bool_)):
            raise TypeError(f"{source} returned {result!r}, not a number (the reward)")
        try:
            reward = float(result)
        except OverflowError:  # 10**400: Python's own text ("int too large to convert to
            # float") named neither the agent nor its reward function
            raise ValueError(
                f"{source} returned a number past any float, beyond float32's +-{REWARD_MAX:.4g}"
            ) from None
        if not math.isfinite(reward):
            raise ValueError(f"{source} returned {result}, not a finite reward")
        if abs(reward) > REWARD_MAX:  # inf in the float32 training rows
            raise ValueError(f"{source} returned {reward:g}, beyond float32's +-{REWARD_MAX:.4g}")
        return reward
