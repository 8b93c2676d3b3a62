"""In-process engines: requests queued from the event loop, torch work on one owner thread.

``LocalEngine.generate`` is awaited on the rollout driver's event loop; it only
puts the request in a thread-safe inbox. The engine's torch work runs on the
thread that calls ``serve`` (``run_serving`` makes that the thread which asked
for the rollouts, with the event loop on a helper thread). Why that thread: an
in-process engine then runs torch on the thread that already owns torch's OpenMP
team. From any other thread torch starts a second team; with more OpenMP threads
than cores libgomp stops spinning and sleeps on a futex at every parallel region
(thousands of context switches per call; measured 30-107% slower on tiny models
and ~11% on SmolLM2-135M with hf on 2 cores).

Control calls (weights, prefix cache, ...) made while another thread serves are
queued too and run on the serving thread between engine steps; made while
nobody serves, they run at once on the caller's thread.
"""

from __future__ import annotations

import asyncio
import operator
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any, TypeVar

from skyrl.inference.base import Completion, InferenceEngine, SamplingParams, request_seed

T = TypeVar("T")

CANCEL_WAIT_S = 10.0
"""How long ``run_serving``, interrupted, waits for the cancelled rollouts to end (seconds)."""
QUIET_S = 0.003
"""``take_burst`` stops once no request has arrived for this long (seconds)..."""
MAX_WAIT_S = 0.05
"""...or this long after it started (seconds)."""


@dataclass
class Request:
    """One queued generate request and where its answer goes."""

    prompt_ids: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)

    def resolve(self, completion: Completion) -> None:
        """Hand the completion to the awaiting coroutine (from any thread)."""
        self._hand_over(_set_result, completion)

    def fail(self, error: BaseException) -> None:
        """Fail the request with ``error``; cancel it for an interrupt (``KeyboardInterrupt``,
        ``SystemExit``): set on the future, a rollout task re-raised it inside the event loop,
        which then broke down with the loop's tasks left pending (``run_serving``)."""
        if isinstance(error, Exception):
            self._hand_over(_set_exception, error)
        else:
            self._hand_over(_cancel, None)

    def _hand_over(self, setter, value) -> None:
        try:
            self.loop.call_soon_threadsafe(setter, self.future, value)
        except RuntimeError:  # the loop is closed: whoever asked is gone (a timed-out agent)
            pass


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _cancel(future: asyncio.Future, _: None) -> None:
    future.cancel()


def token_ids(prompt_ids: Any) -> list[int]:
    """``prompt_ids`` as a list of ints (from ints, integer tensors, numpy ints); a
    ``TypeError`` for a text or an id that is no int (a float would be cut silently)."""
    if isinstance(prompt_ids, str | bytes):
        raise TypeError(
            f"prompt_ids is a {type(prompt_ids).__name__}; the engine takes token ids "
            "(a list of ints)"
        )
    ids = []
    for i, token in enumerate(prompt_ids):
        try:
            ids.append(operator.index(token))
        except TypeError:
            raise TypeError(
                f"prompt_ids[{i}] is {token!r} (a {type(token).__name__}), not a token id (an int)"
            ) from None
    return ids


@dataclass
class _Call:
    """A control call queued for the serving thread (``LocalEngine.on_owner``)."""

    fn: Callable[..., Any]
    args: tuple
    result: Future = field(default_factory=Future)

    def __call__(self) -> None:
        try:
            self.result.set_result(self.fn(*self.args))
        except BaseException as exc:
            self.result.set_exception(exc)


_WAKE = object()
"""Put in the inbox to wake a blocked ``serve`` (its ``done`` future finished)."""


class LocalEngine(ABC):
    """Base of the in-process engines: the inbox, ``serve``, and control calls on the owner.

    A subclass implements ``_serve_until(done)``: take requests with ``take``, run
    them, ``resolve`` each; return once ``done`` is done and nothing is in flight.
    """

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._owner: int | None = None
        """Thread id of the thread serving right now (None: nobody serves)."""
        self._taken: list[Request] = []
        """Requests handed out by ``take`` and maybe not resolved yet (failed if serving fails)."""
        self._refused_with: BaseException | None = None
        """Set by ``refuse_requests``: every request from then on fails with it at once."""

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None = None
    ) -> Completion:
        if not isinstance(sampling, SamplingParams):  # read on the serving thread: fail here
            raise TypeError(
                f"sampling is a {type(sampling).__name__}; the engine takes a SamplingParams "
                "(SamplingParams.from_config builds one from generator.sampling)"
            )
        loop = asyncio.get_running_loop()
        request = Request(token_ids(prompt_ids), sampling, loop, loop.create_future())
        self._inbox.put(request)
        if self._refused_with is not None:  # checked after the put: none slips in between
            self._fail_queued(self._refused_with)
        return await request.future

    def serve(self, done: Future) -> None:
        self._owner = threading.get_ident()
        done.add_done_callback(lambda _: self._inbox.put(_WAKE))
        try:
            self._serve_until(done)
        except BaseException as exc:
            self._owner = None  # control calls from now on run on their callers' threads
            for request in self._taken:
                request.fail(exc)
            self._fail_queued(exc)
            raise
        finally:
            self._owner = None
        self._run_queued_calls()

    @abstractmethod
    def _serve_until(self, done: Future) -> None: ...

    def refuse_requests(self, error: BaseException) -> None:
        """Fail the queued requests and every later one at once with ``error``: for an owner
        that will not call ``serve`` again (``EngineActor`` once its serving thread ended),
        where a request would otherwise wait for a server that never comes."""
        self._refused_with = error
        self._fail_queued(error)

    def take(self, block: bool, timeout: float | None = None) -> list[Request]:
        """The requests in the inbox (waiting for the first one when ``block``, at most
        ``timeout`` seconds); queued control calls run here, in order."""
        try:
            first = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return []
        # a request cancelled while queued (its rollout was interrupted or timed out) is dropped
        requests = [r for r in self._sort([first, *self._drain()]) if not r.future.cancelled()]
        self._taken = [r for r in self._taken if not r.future.done()] + requests
        return requests

    def take_burst(
        self, requests: list[Request], done: Future, limit: int | None = None
    ) -> list[Request]:
        """``requests`` plus those that keep arriving right after them (the turns of many
        trajectories started together): until ``QUIET_S`` passes without one, ``MAX_WAIT_S``
        after the start, ``limit`` requests, or ``done``."""
        first = last = time.monotonic()
        while (limit is None or len(requests) < limit) and not done.done():
            wait = min(last + QUIET_S, first + MAX_WAIT_S) - time.monotonic()
            more = self.take(block=True, timeout=wait) if wait > 0 else []
            if not more:
                break
            requests = requests + more
            last = time.monotonic()
        return requests

    def on_owner(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the serving thread when another thread serves, else right here."""
        if self._owner is None or self._owner == threading.get_ident():
            return fn(*args)
        call = _Call(fn, args)
        self._inbox.put(call)
        return call.result.result()

    def _drain(self) -> list[Any]:
        """Everything in the inbox now, without waiting."""
        items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                return items

    @staticmethod
    def _sort(items: list[Any]) -> list[Request]:
        """Run the control calls among ``items`` (in order); return the requests."""
        requests = []
        for item in items:
            if isinstance(item, Request):
                requests.append(item)
            elif item is not _WAKE:
                item()
        return requests

    def _fail_queued(self, error: BaseException) -> None:
        """Fail what waits in the inbox: requests with ``error``, control calls (whose callers
        wait on another thread) with a ``RuntimeError`` naming it."""
        for item in self._drain():
            if isinstance(item, Request):
                item.fail(error)
            elif isinstance(item, _Call):
                item.result.set_exception(
                    RuntimeError(
                        f"the engine stopped serving ({type(error).__name__}) before this call ran"
                    )
                )

    def _run_queued_calls(self) -> None:
        """Control calls that arrived as serving ended; requests stay for the next serve."""
        for request in self._sort(self._drain()):
            self._inbox.put(request)


def run_serving(engine: InferenceEngine, run: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(run)`` on a helper thread while this thread serves ``engine`` (module
    docstring). Also works from a thread that already runs an event loop (Jupyter).

    When serving ends without ``run`` done (Ctrl-C, an engine failure), ``run`` is cancelled
    and its event loop closed (up to ``CANCEL_WAIT_S``) before the error is re-raised: no
    task of it is left pending into the next run in this process."""
    done: Future = Future()
    started: Future = Future()
    """The rollouts' event loop and task, once it runs."""

    async def main() -> T:
        started.set_result((asyncio.get_running_loop(), asyncio.current_task()))
        return await run

    def run_loop() -> None:
        try:
            done.set_result(asyncio.run(main()))
        except BaseException as exc:  # re-raised on the calling thread
            done.set_exception(exc)

    thread = threading.Thread(target=run_loop, name="skyrl-rollouts", daemon=True)
    thread.start()
    try:
        engine.serve(done)
        return done.result()
    except BaseException:
        if not done.done():
            _cancel_rollouts(started, thread)
        raise


def _cancel_rollouts(started: Future, thread: threading.Thread) -> None:
    """Cancel the task ``run_serving`` runs on ``thread`` and wait for its loop to close."""
    try:
        loop, task = started.result(timeout=CANCEL_WAIT_S)
        loop.call_soon_threadsafe(task.cancel)
    except (FutureTimeoutError, RuntimeError):  # never started, or its loop closed meanwhile
        return
    thread.join(timeout=CANCEL_WAIT_S)


def generate_batch(
    engine: InferenceEngine,
    prompts: list[list[int]],
    sampling: SamplingParams,
    route_keys: list[str] | None = None,
) -> list[list[Completion]]:
    """``sampling.n`` completions per prompt, all requests in flight at once (blocking).
    With ``sampling.seed`` set, sample ``j`` of prompt ``i`` is seeded with
    ``request_seed(seed, str(i), j, 0)``. ``route_keys``: one per prompt (a ``ValueError``
    otherwise)."""
    import dataclasses

    if route_keys is not None and len(route_keys) != len(prompts):
        raise ValueError(
            f"generate_batch: {len(route_keys)} route_keys for {len(prompts)} prompts "
            "(one per prompt)"
        )

    def one(i: int, j: int) -> SamplingParams:
        seed = None if sampling.seed is None else request_seed(sampling.seed, str(i), j, 0)
        return dataclasses.replace(sampling, n=1, seed=seed)

    async def run() -> list[list[Completion]]:
        keys: list[str | None] = list(route_keys) if route_keys else [None] * len(prompts)
        groups = [
            asyncio.gather(*(engine.generate(p, one(i, j), keys[i]) for j in range(sampling.n)))
            for i, p in enumerate(prompts)
        ]
        return [list(g) for g in await asyncio.gather(*groups)]

    return run_serving(engine, run())
