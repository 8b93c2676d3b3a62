"""Several engines behind one client: load balancing with prompt affinity.

All requests with the same route key (the prompt's uid) go to the same engine,
so the samples and later turns of a prompt hit that engine's prefix cache. A
new key goes to the engine with the fewest requests in flight. A key is kept
while it has requests in flight and, once they are done, among the
``IDLE_KEYS_KEPT`` most recently done keys, so a later turn (its env step ran
meanwhile) returns to the same engine; an older key is forgotten and routed
afresh (a prefix-cache miss, nothing more). Each request is awaited on its own,
so the engines work in parallel and each batches what it has. Control calls fan
out to every engine in parallel (threads).

An engine in a Ray actor (``RayEngineHandle``) is built and served on a thread
of its own inside the actor (``EngineActor``), so all of its torch work runs on
one thread there, as in-process engines do in the driver.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from skyrl.config.errors import exception_line
from skyrl.inference.base import Completion, InferenceEngine, SamplingParams, WeightItems

logger = logging.getLogger(__name__)

IDLE_KEYS_KEPT = 4096
"""Route keys with nothing in flight that ``EngineClient`` still remembers (newest first)."""


class EngineDiedError(RuntimeError):
    """An inference engine actor died (out of memory, killed, crashed)."""


def name_engine(exc: BaseException, index: int, num_engines: int) -> None:
    """Put ``engine <index> of <num_engines> failed: `` before ``exc``'s message where a client
    has several engines (``index``: the engine's place in ``EngineClient.engines``, from 0).
    The type stays (callers catch ``EngineDiedError``); an exception whose text does not come
    from its first argument (``KeyError`` quotes it) gets the line as a note instead."""
    if num_engines == 1 or getattr(exc, "_skyrl_engine_named", False):
        return
    message = f"engine {index} of {num_engines} failed: {exc}"
    args = exc.args
    exc.args = (message, *args[1:])
    if str(exc) != message:
        exc.args = args
        add_note = getattr(exc, "add_note", None)  # Python 3.11+; 3.10 keeps the bare error
        if add_note is not None:
            add_note(message)
    exc._skyrl_engine_named = True  # type: ignore[attr-defined]  # re-raised: named once


class EngineActor:
    """Runs inside a Ray actor: builds the engine on a serving thread and serves it there
    until ``shutdown``; requests and control calls reach that thread."""

    def __init__(self, engine_cls: type, kwargs: dict[str, Any], num_threads: int = 1):
        built: Future = Future()
        self._done: Future = Future()
        self._stopped: str | None = None
        """Why serving ended before ``shutdown`` (None: it serves)."""

        def build_and_serve() -> None:
            try:
                import torch

                torch.set_num_threads(num_threads)  # the actor's CPUs, on the serving thread
                engine = engine_cls(**kwargs)
            except BaseException as exc:
                built.set_exception(exc)
                return
            built.set_result(engine)
            try:
                engine.serve(self._done)
            except BaseException as exc:  # nothing serves from now on: fail requests at once
                logger.error("inference engine stopped serving", exc_info=exc)
                self._stopped = (
                    f"the inference engine stopped serving after {exception_line(exc)}; "
                    "start a new engine"
                )
                refuse = getattr(engine, "refuse_requests", None)  # LocalEngine: no race
                if refuse is not None:
                    refuse(RuntimeError(self._stopped))

        self._thread = threading.Thread(target=build_and_serve, name="skyrl-engine", daemon=True)
        self._thread.start()
        self.engine: InferenceEngine = built.result()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        if self._stopped is not None:
            raise RuntimeError(self._stopped)
        return await self.engine.generate(prompt_ids, sampling)

    def call(self, method: str, *args: Any) -> Any:
        """A control method of the engine (it runs on the serving thread)."""
        return getattr(self.engine, method)(*args)

    def shutdown(self) -> None:
        self.engine.shutdown()
        self._done.set_result(None)


class RayEngineHandle:
    """The client side of an ``EngineActor``: the engine interface over Ray calls."""

    def __init__(self, actor):
        self.actor = actor

    @classmethod
    def start(
        cls, engine_cls: type, kwargs: dict, num_cpus: float = 1, num_gpus: float = 0
    ) -> RayEngineHandle:
        import ray

        remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(EngineActor)
        return cls(remote.remote(engine_cls, kwargs, max(1, int(num_cpus))))

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None = None
    ) -> Completion:
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return await self.actor.generate.remote(prompt_ids, sampling)
        except RayActorError as exc:
            raise _died("generate", exc) from None
        except RayTaskError as exc:
            raise _engine_error(exc) from None

    def serve(self, done: Future) -> None:
        """The actor serves itself: nothing to do on this thread."""

    def _call(self, name: str, *args: Any) -> Any:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(self.actor.call.remote(name, *args))
        except RayActorError as exc:
            raise _died(name, exc) from None
        except RayTaskError as exc:
            raise _engine_error(exc) from None

    def update_weights(self, weights: WeightItems) -> None:
        self._call("update_weights", _for_every_engine(weights))

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        self._call("join_weight_sync", host, port, first_rank, world_size, backend)

    def receive_weights(self, plan: list) -> None:
        self._call("receive_weights", plan)

    def reset_prefix_cache(self) -> None:
        self._call("reset_prefix_cache")

    def sleep(self) -> None:
        self._call("sleep")

    def wake_up(self) -> None:
        self._call("wake_up")

    def shutdown(self) -> None:
        """Shut the engine down and end the actor."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            ray.get(self.actor.shutdown.remote(), timeout=60)
        except (RayActorError, ray.exceptions.GetTimeoutError):
            pass
        except RayTaskError as exc:
            raise _engine_error(exc) from None
        finally:
            ray.kill(self.actor, no_restart=True)


def _for_every_engine(weights: WeightItems) -> WeightItems:
    """``weights`` in a form every engine can consume: a shared-memory handle stays a handle
    (small to send; each engine maps the file) and a state dict stays a dict (it can be read
    many times); anything else becomes one list (a stream of buckets can be read only once)."""
    from skyrl.inference.shared_weights import SharedWeights

    return weights if isinstance(weights, SharedWeights | dict) else list(weights)


def _died(during: str, exc: Exception) -> EngineDiedError:
    """One line: the first of Ray's message, or, for an engine that raised while it was being
    built (Ray's first line then names only the actor's pid and address), that exception's."""
    lines = [_ANSI.sub("", line) for line in str(exc).strip().splitlines()]
    if not lines:
        return EngineDiedError(f"inference engine actor died during {during}: {type(exc).__name__}")
    if "creation task" in lines[0]:  # a traceback follows: the exception is its first line
        frame = (" ", "\t", "Traceback")  # frames are indented
        raised = next((ln for ln in lines[1:] if ln and not ln.startswith(frame)), None)
        if raised is not None:
            return EngineDiedError(f"inference engine actor failed to start: {raised}")
    return EngineDiedError(f"inference engine actor died during {during}: {lines[0]}")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""Terminal colour codes, which Ray puts around the actor's name."""


def _engine_error(exc: Exception) -> BaseException:
    """The exception an engine raised in its actor, as an in-process engine raises it (its type
    and message; Ray's text of it is the actor's traceback), with that traceback as a note
    (printed with a traceback, not in ``str``)."""
    cause = getattr(exc, "cause", None)
    if not isinstance(cause, Exception):
        return exc
    note = f"raised in the engine actor:\n{_ANSI.sub('', str(exc))}"
    if hasattr(cause, "add_note"):  # Python 3.11+; on 3.10 the actor's traceback is dropped
        cause.add_note(note)
    return cause


class EngineClient:
    """Routes requests over ``engines``; itself an ``InferenceEngine``. The routing state is
    guarded by a lock: event loops on several threads may share the client (asynchronous
    training's stream and an eval pass)."""

    def __init__(self, engines: list[InferenceEngine]):
        if not engines:
            raise ValueError("EngineClient needs at least one engine")
        self.engines = engines
        self.assignment: dict[str, int] = {}
        """Engine index of each key in flight or among the ``IDLE_KEYS_KEPT`` last done."""
        self.load = [0] * len(engines)
        """Requests in flight on each engine."""
        self.in_flight: dict[str, int] = {}
        """Requests in flight per key."""
        self.idle: OrderedDict[str, None] = OrderedDict()
        """Assigned keys with nothing in flight, oldest first."""
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(len(engines))
        self.closed = False
        """``shutdown`` ran: the engines are released (and their actors gone)."""

    def _live(self, what: str) -> None:
        """A ``RuntimeError`` naming ``what`` once ``shutdown`` ran, as each engine says it
        (an actor's engine said "actor died unexpectedly", a control call "cannot schedule
        new futures after shutdown")."""
        if self.closed:
            raise RuntimeError(f"engine client: {what} after shutdown()")

    def route(self, key: str) -> int:
        """The engine index for ``key`` (sticky while remembered; a new key goes to the
        engine with the fewest requests in flight)."""
        with self.lock:
            return self._route(key)

    def _route(self, key: str) -> int:
        if key not in self.assignment:
            self.assignment[key] = min(range(len(self.engines)), key=lambda i: self.load[i])
            self._set_idle(key)
        return self.assignment[key]

    def _set_idle(self, key: str) -> None:
        self.idle[key] = None
        self.idle.move_to_end(key)
        while len(self.idle) > IDLE_KEYS_KEPT:
            del self.assignment[self.idle.popitem(last=False)[0]]

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None = None
    ) -> Completion:
        self._live("generate")
        key = route_key or str(tuple(prompt_ids))
        with self.lock:
            idx = self._route(key)
            self.idle.pop(key, None)
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
            self.load[idx] += 1
        try:
            return await self.engines[idx].generate(prompt_ids, sampling, route_key)
        except Exception as exc:
            name_engine(exc, idx, len(self.engines))
            raise
        finally:
            with self.lock:
                self.load[idx] -= 1
                self.in_flight[key] -= 1
                if not self.in_flight[key]:
                    del self.in_flight[key]
                    self._set_idle(key)

    def serve(self, done: Future) -> None:
        """Serve the first engine on this thread and the others on helper threads (engines
        that serve themselves, Ray actors, return at once)."""
        helpers = [
            threading.Thread(target=e.serve, args=(done,), name=f"skyrl-engine-{i}", daemon=True)
            for i, e in enumerate(self.engines[1:], start=1)
        ]
        for thread in helpers:
            thread.start()
        self.engines[0].serve(done)
        for thread in helpers:
            thread.join()

    def _all(self, what: str, call: Callable[[InferenceEngine], None]) -> None:
        self._live(what)
        self._wait([self.pool.submit(call, e) for e in self.engines])

    def _wait(self, futures: list[Future]) -> None:
        """Wait for one call per engine; the first to fail raises at once, its message naming
        the engine (``name_engine``); the others go on (an engine that failed in a collective
        leaves its peers blocked there: they are not waited for)."""
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for i, future in enumerate(futures):
            exc = future.exception() if future in done else None
            if exc is not None:
                name_engine(exc, i, len(self.engines))
                raise exc
        for future in futures:
            future.result()

    def update_weights(self, weights: WeightItems) -> None:
        named = _for_every_engine(weights)
        self._all("update_weights", lambda e: e.update_weights(named))

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Engine ``i`` joins as ranks ``first_rank + i * per_engine ...`` (all engines at
        once: joining blocks until the whole group is there)."""
        self._live("join_weight_sync")
        per_engine = (world_size - first_rank) // len(self.engines)
        futures = [
            self.pool.submit(
                engine.join_weight_sync,
                host,
                port,
                first_rank + i * per_engine,
                world_size,
                backend,
            )
            for i, engine in enumerate(self.engines)
        ]
        self._wait(futures)

    def receive_weights(self, plan: list) -> None:
        self._all("receive_weights", lambda e: e.receive_weights(plan))

    def reset_prefix_cache(self) -> None:
        self._all("reset_prefix_cache", lambda e: e.reset_prefix_cache())

    def sleep(self) -> None:
        self._all("sleep", lambda e: e.sleep())

    def wake_up(self) -> None:
        self._all("wake_up", lambda e: e.wake_up())

    def shutdown(self) -> None:
        """Shut every engine down; a second call does nothing (as for the engines)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._wait([self.pool.submit(e.shutdown) for e in self.engines])
        finally:
            self.pool.shutdown(wait=False)
