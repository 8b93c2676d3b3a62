"""The built-in rollout driver: many trajectories in flight, one env each, tokens kept exactly.

Per trajectory: render the opening messages, then repeat: ``await
engine.generate`` for this turn alone (the engine batches whatever requests are
in flight: no trajectory waits for another's turn), keep the sampled tokens,
``env.step`` the decoded text, append the observation tokens, until the env is
done, ``max_turns`` is reached, or the token budget (``max_generate_length``
over all turns) runs out. Env calls run in threads under ``timeout_s``; an env
that raises or times out ends its trajectory with reward 0 and counts in
``env/errors``; the run goes on. Each request's seed is
``request_seed(base, uid, sample, turn)``. Each request also stops on the chat
template's turn-end token when that is not EOS (``ChatTokens.turn_stop_ids``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import Message, TextEnv
from skyrl.generators.chat import ChatTokens
from skyrl.generators.output import check_prefix
from skyrl.generators.tool_calls import ToolCallParser, declared_tools
from skyrl.generators.trajectory import (
    DriverContext,
    LoopSettings,
    Trajectory,
    Turn,
    VersionClock,
)
from skyrl.inference.base import InferenceEngine, SamplingParams, request_seed


def opening_messages(env: TextEnv, row: PromptRow) -> list[Message]:
    """The messages a row's first turn is generated from: the env's ``init`` (which may add a
    system prompt). The first context is ``ChatTokens.prompt_ids`` of them, with the tools
    ``declared_tools`` gives; the prompt-length check at load (``skyrl.data.checked``)
    renders a row with these same three calls."""
    messages, _info = env.init(row.prompt, row.extras)
    return messages


class AgentLoop:
    """Runs trajectories for prompt rows against an engine and an env factory."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer,
        env_factory: Callable[[], TextEnv],
        settings: LoopSettings,
        clock: VersionClock | None = None,
        max_env_threads: int = 32,
        tool_parser: str = "hermes",
    ):
        self.engine = engine
        self.chat = ChatTokens(tokenizer)
        self.parser = ToolCallParser(tokenizer, tool_parser)
        self.env_factory = env_factory
        self.settings = settings
        self.clock = clock or VersionClock()
        self.pool = ThreadPoolExecutor(max_env_threads, thread_name_prefix="skyrl-env")

    @classmethod
    def from_context(cls, ctx: DriverContext) -> AgentLoop:
        """The ``generator.agent=agent_loop`` factory."""
        parser = ctx.config.tool_parser if ctx.config is not None else "hermes"
        return cls(
            ctx.engine, ctx.tokenizer, ctx.env_factory, ctx.settings, ctx.clock,
            tool_parser=parser,
        )  # fmt: skip

    async def run(
        self, rows: list[PromptRow], n_samples: int, sampling: SamplingParams
    ) -> list[Trajectory]:
        """All ``n_samples`` trajectories of every row, in (row, sample) order."""
        tasks = [self.run_trajectory(row, k, sampling) for row in rows for k in range(n_samples)]
        return list(await asyncio.gather(*tasks))

    async def run_trajectory(
        self, row: PromptRow, sample: int, sampling: SamplingParams
    ) -> Trajectory:
        tid = f"{row.uid}/{sample}"
        env = self.env_factory()
        try:
            return await self._turns(env, row, tid, sample, sampling)
        finally:
            await self._safe_env_call(env.close)

    async def _env_call(self, fn, *args):
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(
            loop.run_in_executor(self.pool, fn, *args), self.settings.env_timeout_s
        )

    async def _safe_env_call(self, fn, *args):
        """``(result, None)`` or ``(None, error)`` when the env raises or times out."""
        try:
            return await self._env_call(fn, *args), None
        except (Exception, asyncio.TimeoutError) as exc:
            return None, exc

    async def _generate(
        self, context: list[int], sampling: SamplingParams, row: PromptRow, sample: int, turn: int
    ) -> Turn:
        """One request: this turn of this trajectory, with its own seed and versions."""
        seed = None if sampling.seed is None else request_seed(sampling.seed, row.uid, sample, turn)
        version = await self.clock.dispatch_version()
        started = time.monotonic()
        stop_ids = list(sampling.stop_token_ids)
        stop_ids += [t for t in self.chat.turn_stop_ids if t not in stop_ids]
        request = replace(sampling, n=1, seed=seed, stop_token_ids=stop_ids)
        out = await self.engine.generate(context, request, row.uid)
        return Turn(
            list(context),
            out.token_ids,
            out.logprobs,
            out.finish_reason,
            version_dispatched=version,
            version_finished=self.clock.current,
            dispatched_at=started,
            finished_at=time.monotonic(),
        )

    async def _turns(self, env, row, tid, sample, sampling) -> Trajectory:
        s = self.settings
        turns: list[Turn] = []
        # toolkit code, not the env's (the first call may import the tool parser): no timeout
        loop = asyncio.get_running_loop()
        tools = await loop.run_in_executor(self.pool, declared_tools, env, self.chat, self.parser)
        messages, err = await self._safe_env_call(opening_messages, env, row)
        if err is not None:
            return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
        context = self.chat.prompt_ids(messages, tools)
        if len(context) > s.max_prompt_length:  # the loaders drop or reject these first
            raise ValueError(
                f"prompt {row.uid!r} has {len(context)} tokens > generator.max_prompt_length={s.max_prompt_length}"
            )
        prompt_len, reward, stop = len(context), 0.0, "max_turns"
        for turn_idx in range(s.max_turns):
            budget = s.max_generate_length - (len(context) - prompt_len)
            budget = min(budget, s.max_tokens_per_turn or budget)
            turn = await self._generate(  # engine errors propagate
                context, replace(sampling, max_tokens=budget), row, sample, turn_idx
            )
            turns.append(turn)
            result, err = await self._safe_env_call(env.step, self.chat.decode(turn.response_ids))
            if err is not None:
                return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
            reward = float(result.reward)
            if result.done or turn_idx + 1 == s.max_turns:
                if turn.finish_reason == "length":  # a cut-off last reply: overlong filtering
                    stop = "length"
                elif result.done:
                    stop = "stop"
                break
            ended = self.chat.ends_turn(turn.response_ids)
            appended = self.chat.observation_ids(result.observations, ended, tools)
            used = len(context) - prompt_len + len(turn.response_ids) + len(appended)
            if used >= s.max_generate_length:  # no room for the observation and a reply
                stop = "budget"
                break
            turn.appended_ids = appended
            new_context = context + turn.response_ids + appended
            check_prefix(context + turn.response_ids, new_context, tid, turn_idx + 1)
            context = new_context
        return Trajectory(row, tid, turns, reward, stop)
