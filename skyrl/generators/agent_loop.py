"""The multi-turn agent loop: many trajectories in flight, one env each, tokens kept exactly.

Per trajectory: render the opening messages, then repeat: generate (batched
with the other trajectories by ``RequestBatcher``), keep the sampled tokens,
``env.step`` the decoded text, append the observation tokens, until the env is
done, ``max_turns`` is reached, or the token budget (``max_generate_length``
over all turns) runs out. Env calls run in threads under ``timeout_s``; an env
that raises or times out ends its trajectory with reward 0 and counts in
``env/errors``; the run goes on. ``Generator.generate`` runs the event loop on a
helper thread and the engine calls on the calling thread (``CallerThread``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import TextEnv
from skyrl.generators.batcher import CallerThread, RequestBatcher
from skyrl.generators.chat import ChatTokens
from skyrl.generators.metrics import rollout_metrics
from skyrl.generators.output import GeneratorOutput, check_prefix
from skyrl.inference.base import SamplingParams


@dataclass
class Turn:
    """One LLM call of a trajectory."""

    prompt_ids: list[int]
    """Full context given to the engine."""
    response_ids: list[int]
    """Tokens the engine sampled."""
    logprobs: list[float]
    """Their logprobs."""
    finish_reason: str
    """Engine finish reason: stop / length."""
    appended_ids: list[int] = field(default_factory=list)
    """Tokens appended after this turn (EOS if missing, template, observations)."""


@dataclass
class Trajectory:
    """A finished rollout of one sample of one prompt."""

    row: PromptRow
    trajectory_id: str
    turns: list[Turn]
    reward: float
    stop_reason: str
    env_errors: int = 0


@dataclass
class LoopSettings:
    """What the loop needs from ``generator`` / ``environment`` config."""

    max_prompt_length: int
    max_generate_length: int
    max_turns: int
    env_timeout_s: float = 10.0
    max_tokens_per_turn: int | None = None


class AgentLoop:
    """Runs trajectories for prompt rows against an engine and an env factory."""

    def __init__(
        self,
        engine,
        tokenizer,
        env_factory: Callable[[], TextEnv],
        settings: LoopSettings,
        max_env_threads: int = 32,
    ):
        self.engine = engine
        self.chat = ChatTokens(tokenizer)
        self.env_factory = env_factory
        self.settings = settings
        self.pool = ThreadPoolExecutor(max_env_threads, thread_name_prefix="skyrl-env")

    async def _env_call(self, fn, *args):
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(
            loop.run_in_executor(self.pool, fn, *args), self.settings.env_timeout_s
        )

    async def run_trajectory(
        self, row: PromptRow, sample: int, sampling: SamplingParams, batcher: RequestBatcher
    ) -> Trajectory:
        tid = f"{row.uid}/{sample}"
        batcher.enter()
        try:
            return await self._run(row, tid, sample, sampling, batcher)
        finally:
            batcher.exit()

    async def _safe_env_call(self, fn, *args):
        """``(result, None)`` or ``(None, error)`` when the env raises or times out."""
        try:
            return await self._env_call(fn, *args), None
        except (Exception, asyncio.TimeoutError) as exc:
            return None, exc

    async def _run(self, row, tid, sample, sampling, batcher) -> Trajectory:
        env = self.env_factory()
        try:
            return await self._turns(env, row, tid, sample, sampling, batcher)
        finally:
            await self._safe_env_call(env.close)

    async def _turns(self, env, row, tid, sample, sampling, batcher) -> Trajectory:
        s = self.settings
        turns: list[Turn] = []
        init, err = await self._safe_env_call(env.init, row.prompt, row.extras)
        if err is not None:
            return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
        context = self.chat.prompt_ids(init[0])
        if len(context) > s.max_prompt_length:
            raise ValueError(
                f"prompt {row.uid!r} has {len(context)} tokens > generator.max_prompt_length={s.max_prompt_length}"
            )
        prompt_len, reward, stop = len(context), 0.0, "max_turns"
        for turn_idx in range(s.max_turns):
            budget = s.max_generate_length - (len(context) - prompt_len)
            budget = min(budget, s.max_tokens_per_turn or budget)
            seed = None if sampling.seed is None else sampling.seed + 7919 * sample + turn_idx
            sp = replace(sampling, n=1, max_tokens=budget, seed=seed)
            out = await batcher.generate(context, sp, row.uid)  # engine errors propagate
            turn = Turn(list(context), out.token_ids, out.logprobs, out.finish_reason)
            turns.append(turn)
            result, err = await self._safe_env_call(env.step, self.chat.decode(out.token_ids))
            if err is not None:
                return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
            reward = float(result.reward)
            if result.done:
                stop = "length" if out.finish_reason == "length" else "stop"
                break
            if turn_idx + 1 == s.max_turns:
                break
            ended_eos = bool(out.token_ids) and out.token_ids[-1] == self.chat.eos_id
            appended = self.chat.observation_ids(result.observations, ended_eos)
            used = len(context) - prompt_len + len(out.token_ids) + len(appended)
            if used >= s.max_generate_length:  # no room for the observation and a reply
                stop = "budget"
                break
            turn.appended_ids = appended
            new_context = context + out.token_ids + appended
            check_prefix(context + out.token_ids, new_context, tid, turn_idx + 1)
            context = new_context
        return Trajectory(row, tid, turns, reward, stop)

    async def run(
        self,
        rows: list[PromptRow],
        n_samples: int,
        sampling: SamplingParams,
        max_wait_s: float = 0.02,
        engine_calls: Executor | None = None,
    ) -> list[Trajectory]:
        """All ``n_samples`` trajectories of every row, in (row, sample) order; engine calls
        run on ``engine_calls`` (None: the event loop's default thread pool)."""
        batcher = RequestBatcher(self.engine, max_wait_s, engine_calls)
        tasks = [
            self.run_trajectory(row, k, sampling, batcher) for row in rows for k in range(n_samples)
        ]
        return list(await asyncio.gather(*tasks))


def trajectories_to_output(trajs: list[Trajectory], step_wise: bool) -> GeneratorOutput:
    """Rows for training: one per trajectory, or one per turn when ``step_wise``."""
    out = GeneratorOutput([], [], [], [], [], [], [], [], [], [], step_wise=step_wise)

    def add(prompt, resp, mask, lps, reward, t: Trajectory, last: bool):
        out.prompt_token_ids.append(prompt)
        out.response_token_ids.append(resp)
        out.loss_masks.append(mask)
        out.rollout_logprobs.append(lps)
        out.rewards.append(reward if last else 0.0)
        out.uids.append(t.row.uid)
        out.trajectory_ids.append(t.trajectory_id)
        out.is_last_step.append(last)
        out.data_sources.append(t.row.data_source)
        out.stop_reasons.append(t.stop_reason)

    for t in trajs:
        if not t.turns:  # env failed before the first turn: an empty, masked row
            add([], [], [], [], t.reward, t, True)
            continue
        if step_wise:
            for k, turn in enumerate(t.turns):
                n = len(turn.response_ids)
                last = k + 1 == len(t.turns)
                add(turn.prompt_ids, turn.response_ids, [1] * n, turn.logprobs, t.reward, t, last)
            continue
        resp, mask, lps = [], [], []
        for turn in t.turns:
            resp += turn.response_ids + turn.appended_ids
            mask += [1] * len(turn.response_ids) + [0] * len(turn.appended_ids)
            lps += turn.logprobs + [0.0] * len(turn.appended_ids)
        if t.turns[-1].appended_ids:  # trailing observation is never trained on
            cut = len(t.turns[-1].appended_ids)
            resp, mask, lps = resp[:-cut], mask[:-cut], lps[:-cut]
        add(t.turns[0].prompt_ids, resp, mask, lps, t.reward, t, True)
    return out


class Generator:
    """Rollouts for a list of prompt rows -> ``GeneratorOutput`` (validated, with metrics)."""

    def __init__(self, loop: AgentLoop, step_wise: bool = False):
        self.loop = loop
        self.step_wise = step_wise

    def generate(
        self, rows: list[PromptRow], n_samples: int, sampling: SamplingParams
    ) -> GeneratorOutput:
        """Run every sample of every row (blocking) and convert to training rows."""
        t0 = time.perf_counter()
        engine_calls = CallerThread()
        run = self.loop.run(rows, n_samples, sampling, engine_calls=engine_calls)
        trajs = _run_serving(run, engine_calls)
        elapsed = time.perf_counter() - t0
        out = trajectories_to_output(trajs, self.step_wise)
        out.validate()
        out.metrics = rollout_metrics(trajs, n_samples, elapsed)
        return out


def _run_serving(run: Coroutine, engine_calls: CallerThread):
    """``asyncio.run(run)`` on a helper thread while this thread serves ``engine_calls``
    (why: ``skyrl.generators.batcher``). Also works from a thread that already runs an
    event loop (Jupyter)."""
    done: Future = Future()

    def run_loop() -> None:
        try:
            done.set_result(asyncio.run(run))
        except BaseException as exc:  # re-raised on the calling thread
            done.set_exception(exc)
        finally:
            engine_calls.shutdown()

    threading.Thread(target=run_loop, name="skyrl-agent-loop", daemon=True).start()
    engine_calls.serve()
    return done.result()


def make_generator(gen_cfg, env_cfg, engine, tokenizer) -> Generator:
    """A ``Generator`` from the ``generator`` and ``environment`` config groups."""
    from skyrl.envs import make_env_factory

    settings = LoopSettings(
        max_prompt_length=gen_cfg.max_prompt_length,
        max_generate_length=gen_cfg.max_generate_length,
        max_turns=gen_cfg.max_turns,
        env_timeout_s=env_cfg.timeout_s,
        max_tokens_per_turn=gen_cfg.max_tokens_per_turn,
    )
    loop = AgentLoop(engine, tokenizer, make_env_factory(env_cfg), settings)
    return Generator(loop, step_wise=gen_cfg.step_wise)
