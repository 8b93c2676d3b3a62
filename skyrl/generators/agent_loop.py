"""The built-in rollout driver: many trajectories in flight, one env each, tokens kept exactly.

Per trajectory: render the opening messages, then repeat: ``await
engine.generate`` for this turn alone (the engine batches whatever requests are
in flight: no trajectory waits for another's turn), keep the sampled tokens,
``env.step`` the decoded text (special tokens kept, all but the stop, when the env's
tools are native: ``ChatTokens.reply_text``), append the observation tokens, until the env is
done, ``max_turns`` is reached, the token budget (``max_generate_length`` over all turns)
runs out, or the engine's context does (a reply cut short of its ``max_tokens``: the
model's context is smaller than ``max_prompt_length + max_generate_length``; the trajectory
ends ``length``). Each env call (its constructor, ``init``, ``step``, ``close``) runs
on a thread of its own (``EnvThreads``) under ``timeout_s``; an env that raises, times out,
returns what the loop cannot use (``step_result_problem``: a NaN or None reward, a done that
is no bool, a message whose content is not a string) or an opening or observation the chat
template cannot render ends its trajectory with reward 0 and counts in ``env/errors``, logged
once per distinct problem; the run goes on (an env that calls ``sys.exit()`` too:
``EnvExit``). Python cannot stop a thread, so a timed-out call's thread runs on unwatched: it
no longer counts against the ``environment.max_concurrent_calls`` that may run at once, the
env is closed on that thread once the call returns (never under it; an env built past the
limit once it exists), and more than ``environment.max_hung_calls`` such calls still running
stop the run with ``EnvHangError``. A cancelled trajectory (an asynchronous run's shutdown)
does not wait for its env's close: that runs on a thread not waited for. Each request's seed
is ``request_seed(base, uid, sample, turn)``. Each request also stops on the chat template's
turn-end token when that is not EOS (``ChatTokens.turn_stop_ids``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import Message, StepResult, TextEnv, messages_problem, step_result_problem
from skyrl.generators.chat import ChatTokens, NotAppendOnly, RefusedObservations
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

logger = logging.getLogger(__name__)


def opening_messages(env: TextEnv, row: PromptRow) -> list[Message]:
    """The messages a row's first turn is generated from: the env's ``init`` (which may add a
    system prompt). The first context is ``ChatTokens.prompt_ids`` of them, with the tools
    ``declared_tools`` gives; the prompt-length check at load (``skyrl.data.checked``)
    renders a row with these same three calls. An ``init`` that returns anything but the
    pair ``(messages, info)`` (the messages alone, say) raises ``BadEnvResult``."""
    result = env.init(row.prompt, row.extras)
    problem = init_result_problem(result)
    if problem is not None:
        raise BadEnvResult(problem)
    return result[0]


def init_result_problem(result: object) -> str | None:
    """Why ``result`` is not the pair ``(messages, info)`` an env's ``init`` returns (None: it
    is one; its messages are checked on their own). A list of messages is the messages alone:
    two of them would otherwise unpack as a message and an info."""
    if isinstance(result, list) and all(isinstance(m, Mapping) for m in result):
        what = f"a list of {len(result)} message{'s' if len(result) != 1 else ''}"
    elif not isinstance(result, tuple | list):
        what = f"a {type(result).__name__}"
    elif len(result) != 2:
        what = f"a {type(result).__name__} of {len(result)} items"
    else:
        return None
    return f"it returned {what}, not the pair (messages, info)"


class EnvHangError(RuntimeError):
    """More env calls are still running past their time limit than ``EnvThreads`` allows."""


class EnvTimeout(TimeoutError):
    """An env call ran past its time limit (``EnvThreads``); a ``TimeoutError`` the env raised
    itself (its socket, its sandbox client) is not one and is reported as raised."""


class EnvExit(RuntimeError):
    """An env call raised what is no ``Exception`` (``SystemExit``: ``sys.exit()``, ``exit()``,
    an argparse error in the env's code). On its env thread it ends that call alone: handed to
    the event loop as it was, it stopped the whole run (asyncio lets ``SystemExit`` through
    every task). The message is how the log names it: ``raised SystemExit: 2``."""


class BadEnvResult(ValueError):
    """An env call returned what the loop cannot use; the message says what."""


def _failure(exc: Exception) -> str:
    """How the log names an env call's failure: the loop's own errors (an unusable result, a
    time limit, a ``sys.exit()``) by their message, anything else as ``raised Type: message``."""
    if isinstance(exc, BadEnvResult | EnvTimeout | EnvExit):
        return str(exc)
    return f"raised {type(exc).__name__}: {exc}"


def checked_opening(env: TextEnv, row: PromptRow) -> list[Message]:
    """``opening_messages``, refused unless they are messages with string role and content,
    some of it not blank (as a prompt row's must be: no messages at all stopped the run in the
    chat template, "Cannot apply chat template to an empty conversation")."""
    messages = opening_messages(env, row)
    problem = messages_problem(messages, "messages")
    if problem is None and not any(m["content"].strip() for m in messages):
        problem = "messages is empty" if not messages else "every message's content is blank"
    if problem is not None:
        raise BadEnvResult(problem)
    return messages


REWARD_MAX = 3.4028234663852886e38
"""The largest reward magnitude the training rows hold (``rewards`` is float32, and this is
``torch.finfo(torch.float32).max``): a larger finite one would be inf there, and every
advantage of its group NaN."""


def checked_step(env: TextEnv, action_text: str) -> StepResult:
    """``env.step(action_text)``, refused unless ``step_result_problem`` finds nothing and the
    reward fits the training rows' float32 (``REWARD_MAX``)."""
    result = env.step(action_text)
    problem = step_result_problem(result)
    if problem is None and abs(float(result.reward)) > REWARD_MAX:
        problem = f"reward is {float(result.reward):g}, beyond float32's +-{REWARD_MAX:.4g}"
    if problem is not None:
        raise BadEnvResult(problem)
    return result


class _Unbuilt:
    """Stands for an env while its constructor runs (``EnvThreads`` tracks calls by env):
    closing it closes the env the constructor returned, if it returned one, so an env built
    after its time limit is closed on that thread once it exists."""

    def __init__(self, factory: Callable[[], TextEnv]):
        self.factory = factory
        self.env: TextEnv | None = None
        self.name = f"{factory.__name__ if isinstance(factory, type) else 'env_factory'}()"
        """How the log names the call."""

    def build(self) -> TextEnv:
        self.env = self.factory()
        return self.env

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


@dataclass(eq=False)
class _Call:
    """One env call's thread, as ``EnvThreads`` tracks it (fields under ``EnvThreads.lock``)."""

    returned: bool = False
    abandoned: bool = False
    """Its caller stopped waiting (time limit, or cancelled) before it returned: it counts
    in ``EnvThreads.stuck`` until it does."""
    then: list[Callable[[], object]] = field(default_factory=list)
    """Run on its thread once it returns (an abandoned call's env close)."""


class EnvThreads:
    """Env calls (user code that may block for good), each on a daemon thread of its own.

    At most ``max_running`` calls run at once; a call's time limit starts when it gets a
    slot, so time queued does not count against it. A call past its limit is abandoned:
    its caller gets ``EnvTimeout`` and its slot frees, while the thread (which nothing can
    stop; daemon, so it never holds up exit) runs on. ``close`` of an env whose call hangs
    runs on that thread after the call returns; ``close_detached`` closes an env without
    waiting (a cancelled trajectory). More than ``max_stuck`` abandoned calls still running
    raise ``EnvHangError``: a fixed pool instead loses a thread to each one for good until
    every env call waits forever."""

    def __init__(self, max_running: int, max_stuck: int):
        self.max_running, self.max_stuck = max_running, max_stuck
        self.lock = threading.Lock()
        self.stuck = 0
        """Abandoned calls still running."""
        self._hung: dict[int, _Call] = {}  # id(env) -> its abandoned call
        self._logged_closes: set[str] = set()
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None

    def _slots_here(self) -> asyncio.Semaphore:
        """The slots of the running event loop (``Generator.generate`` runs a new one per
        call, and a semaphore belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self.max_running), loop
        return self._slots

    async def run(self, env, fn, *args, timeout_s: float | None, slot: bool = True):
        """``fn(*args)`` on its own thread: its result or exception; ``EnvTimeout`` after
        ``timeout_s`` seconds running (None: no limit; ``slot=False``: not counted against
        ``max_running``, for toolkit calls that must not wait behind the env's)."""
        if not slot:
            return await self._watch(env, fn, args, timeout_s)
        async with self._slots_here():
            return await self._watch(env, fn, args, timeout_s)

    async def _watch(self, env, fn, args, timeout_s: float | None):
        loop = asyncio.get_running_loop()
        future, call = loop.create_future(), _Call()
        thread = threading.Thread(
            target=self._work, args=(call, loop, future, fn, args), name="skyrl-env", daemon=True
        )
        thread.start()
        try:
            return await asyncio.wait_for(future, timeout_s)
        except (TimeoutError, asyncio.TimeoutError, asyncio.CancelledError) as exc:  # 3.10: two
            with self.lock:
                if call.returned:  # it returned (the env's own TimeoutError too): nothing runs on
                    raise
                call.abandoned, self._hung[id(env)] = True, call
                self.stuck += 1
                stuck = self.stuck
            if not isinstance(exc, asyncio.CancelledError) and stuck > self.max_stuck:
                raise EnvHangError(
                    f"{stuck} env calls are still running past environment.timeout_s="
                    f"{timeout_s:g} (a thread cannot be stopped; at most "
                    f"environment.max_hung_calls={self.max_stuck} may hang): the env's step, "
                    "init or close never returns - fix it or give it its own time limit"
                ) from None
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise EnvTimeout(f"ran past environment.timeout_s={timeout_s:g}") from None

    def _work(self, call: _Call, loop, future, fn, args) -> None:
        outcome: tuple[Any, BaseException | None]
        try:
            outcome = (fn(*args), None)
        except Exception as exc:  # handed to the caller
            outcome = (None, exc)
        except BaseException as exc:  # SystemExit: of this call, not of the run (EnvExit)
            error = EnvExit(f"raised {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            outcome = (None, error)
        with self.lock:
            call.returned = True
            self.stuck -= call.abandoned
            then = list(call.then)
        for after in then:
            try:
                after()
            except Exception:
                logger.exception("closing an env after its hung call returned")
        try:
            loop.call_soon_threadsafe(_resolve, future, *outcome)
        except RuntimeError:  # that event loop is closed: nobody waits any more
            pass

    async def close(self, env, timeout_s: float) -> None:
        """``env.close()``: now, or on the thread of its hung call once that returns. Cancelled
        while waiting for a slot, the close still runs, on a thread of its own
        (``close_detached``). A close that raises or times out is logged, one line per
        distinct failure (``_close_failed``)."""
        if self._close_after_hung_call(env):
            return
        started = False
        try:
            async with self._slots_here():
                started = True
                await self._watch(env, env.close, (), timeout_s)
        except asyncio.CancelledError:
            if not started:
                _detach(lambda: self._close_logged(env))
            raise
        except EnvHangError:
            raise
        except Exception as exc:  # EnvTimeout included
            self._close_failed(env, exc)
        finally:  # a hung close leaves nothing to run after it (and ids are reused)
            with self.lock:
                self._hung.pop(id(env), None)

    def close_detached(self, env) -> None:
        """``env.close()`` not waited for, for a cancelled trajectory (its caller is going
        away): on the thread of its hung call once that returns, else on a daemon thread of
        its own, outside ``max_running`` and with no time limit (as a hung call's thread)."""
        if not self._close_after_hung_call(env):
            _detach(lambda: self._close_logged(env))

    def _close_after_hung_call(self, env) -> bool:
        """Whether a call of ``env`` hangs: then its close is queued to run after it."""
        with self.lock:
            call = self._hung.pop(id(env), None)
            if call is not None and not call.returned:
                call.then.append(lambda: self._close_logged(env))
                return True
        return False

    def _close_logged(self, env) -> None:
        """``env.close()`` here and now, a failure logged as ``_close_failed`` does."""
        try:
            env.close()
        except Exception as exc:
            self._close_failed(env, exc)

    def _close_failed(self, env, exc: Exception) -> None:
        """One warning line per distinct failure of a close: an env whose close raises does so
        on every trajectory (a traceback each flooded the log)."""
        name = type(env.env if isinstance(env, _Unbuilt) else env).__name__
        message = f"{name}.close: {_failure(exc)}"
        with self.lock:
            if message in self._logged_closes:
                return
            self._logged_closes.add(message)
        logger.warning(message)


def _detach(close: Callable[[], object]) -> None:
    """``close()`` (``EnvThreads._close_logged``: it logs its own failure) on a daemon thread
    of its own, not waited for."""
    threading.Thread(target=close, name="skyrl-env", daemon=True).start()


def _resolve(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():  # the caller stopped waiting
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class AgentLoop:
    """Runs trajectories for prompt rows against an engine and an env factory (called on env
    threads like every env call, so several envs may be built at once)."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer,
        env_factory: Callable[[], TextEnv],
        settings: LoopSettings,
        clock: VersionClock | None = None,
        tool_parser: str = "hermes",
    ):
        self.engine = engine
        self.chat = ChatTokens(tokenizer)
        self.parser = ToolCallParser(tokenizer, tool_parser)
        self.env_factory = env_factory
        self.settings = settings
        self.clock = clock or VersionClock()
        self.env_threads = EnvThreads(settings.max_env_calls, settings.max_hung_env_calls)
        self._logged_env_errors: set[str] = set()

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
        """All ``n_samples`` trajectories of every row, in (row, sample) order; each on its
        own copy of the row (``PromptRow.for_sample``)."""
        tasks = [
            self.run_trajectory(row.for_sample(), k, sampling)
            for row in rows
            for k in range(n_samples)
        ]
        return list(await asyncio.gather(*tasks))

    async def run_trajectory(
        self, row: PromptRow, sample: int, sampling: SamplingParams
    ) -> Trajectory:
        tid = f"{row.uid}/{sample}"
        unbuilt = _Unbuilt(self.env_factory)
        env: TextEnv | _Unbuilt = unbuilt
        cancelled = False
        try:
            built, err = await self._safe_env_call(unbuilt, unbuilt.name, unbuilt.build)
            if err is not None:
                return Trajectory(row, tid, [], 0.0, "env_error", env_errors=1)
            env = built
            return await self._turns(built, row, tid, sample, sampling)
        except asyncio.CancelledError:  # a shutdown: its env closes without holding it up
            cancelled = True
            self.env_threads.close_detached(env)
            raise
        finally:  # after a hung call: on its thread once it returns
            if not cancelled:
                await self.env_threads.close(env, self.settings.env_timeout_s)

    async def _safe_env_call(self, env, where: str, fn, *args):
        """``(result, None)``, or ``(None, error)`` when the env raises, times out or returns
        what the loop cannot use (``BadEnvResult``); ``where`` names the call in the log."""
        try:
            result = await self.env_threads.run(
                env, fn, *args, timeout_s=self.settings.env_timeout_s
            )
        except EnvHangError:
            raise
        except Exception as exc:  # EnvTimeout included
            self._log_env_error(where, exc)
            return None, exc
        return result, None

    def _log_env_error(self, where: str, exc: Exception) -> None:
        """One warning per distinct problem: a bad env fails the same way on every trajectory."""
        message = f"{where}: {_failure(exc)}; its trajectory ends with reward 0 (env_error)"
        if message not in self._logged_env_errors:
            self._logged_env_errors.add(message)
            logger.warning(message)

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

    def _opening_ids(self, messages: list[Message], tools, where: str) -> list[int] | None:
        """The first context, or None (logged as an env error of ``where``) when the chat
        template refuses the opening or it is longer than ``max_prompt_length``. The loaders
        drop or reject such rows first, by an init call of their own: this one returned
        another opening (it varies), and the template's error stopped the whole run."""
        try:
            context = self.chat.prompt_ids(messages, tools)
        except Exception as exc:  # its raise_exception: roles that do not alternate, say
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            problem = f"the chat template cannot render its opening ({why})"
        else:
            if len(context) <= self.settings.max_prompt_length:
                return context
            problem = (  # no count: logged once, however long each one is
                "its opening is longer than generator.max_prompt_length="
                f"{self.settings.max_prompt_length} tokens (the load check measured a shorter one)"
            )
        self._log_env_error(where, BadEnvResult(problem))
        return None

    async def _turns(self, env, row, tid, sample, sampling) -> Trajectory:
        s = self.settings
        turns: list[Turn] = []
        name = type(env).__name__
        # toolkit code (the first call may import the tool parser): no time limit, and no
        # slot, so it never waits behind env calls; the env's tool_schemas and
        # use_native_tools run in it: a ValueError is the env refusing this template or
        # parser (tool_format=native without tools in the template: the run's config, which
        # the load check refuses too), any other error that trajectory's env error
        try:
            tools = await self.env_threads.run(
                env, declared_tools, env, self.chat, self.parser, timeout_s=None, slot=False
            )
        except (EnvHangError, ValueError):
            raise
        except Exception as exc:
            self._log_env_error(f"{name}.tool_schemas", exc)
            return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
        messages, err = await self._safe_env_call(env, f"{name}.init", checked_opening, env, row)
        if err is not None:
            return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
        context = self._opening_ids(messages, tools, f"{name}.init")
        if context is None:
            return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
        prompt_len, reward, stop = len(context), 0.0, "max_turns"
        for turn_idx in range(s.max_turns):
            budget = s.max_generate_length - (len(context) - prompt_len)
            budget = min(budget, s.max_tokens_per_turn or budget)
            turn = await self._generate(  # engine errors propagate
                context, replace(sampling, max_tokens=budget), row, sample, turn_idx
            )
            turns.append(turn)
            # native tools: the parser may need special tokens (a model's <tool_call>)
            action = self.chat.reply_text(
                turn.response_ids,
                keep_special=tools is not None,
                stopped=turn.finish_reason == "stop",
                stop_strings=sampling.stop,
            )
            result, err = await self._safe_env_call(env, f"{name}.step", checked_step, env, action)
            if err is not None:
                return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
            reward = float(result.reward)
            # cut short of its max_tokens: the engine's context (the model's, when smaller than
            # max_prompt_length + max_generate_length) is full, and refuses a longer prompt
            context_full = turn.finish_reason == "length" and len(turn.response_ids) < budget
            if result.done or turn_idx + 1 == s.max_turns or context_full:
                if turn.finish_reason == "length":  # a cut-off last reply: overlong filtering
                    stop = "length"
                elif result.done:
                    stop = "stop"
                break
            ended = self.chat.ends_turn(turn.response_ids)
            try:
                appended = self.chat.observation_ids(result.observations, ended, tools)
            except (NotAppendOnly, RefusedObservations):  # the template's, on every
                raise  # trajectory: stop the run
            except Exception as exc:  # a message the template fails on
                why = f"{type(exc).__name__}: {exc}"
                problem = f"the chat template cannot render its observations ({why})"
                self._log_env_error(f"{name}.step", BadEnvResult(problem))
                return Trajectory(row, tid, turns, 0.0, "env_error", env_errors=1)
            used = len(context) - prompt_len + len(turn.response_ids) + len(appended)
            if used >= s.max_generate_length:  # no room for the observation and a reply
                stop = "budget"
                break
            turn.appended_ids = appended
            new_context = context + turn.response_ids + appended
            check_prefix(context + turn.response_ids, new_context, tid, turn_idx + 1)
            context = new_context
        return Trajectory(row, tid, turns, reward, stop)
