"""Micro-batching of per-trajectory generate requests into batched engine calls.

Each trajectory awaits ``generate`` for one turn at a time; the batcher sends
everything pending as ONE engine call as soon as every live trajectory is
waiting (lock-step turns batch fully), or after ``max_wait_s`` when some are
still busy in their env. One engine call is in flight at a time, on the
``engine_calls`` executor, so env steps keep going meanwhile.

``CallerThread`` is that executor in ``Generator.generate``: engine calls run on
the thread that called it, the event loop on a helper thread. An in-process
engine (hf, vllm) then runs torch on the thread that already owns torch's OpenMP
team. From any other thread torch starts a second team; with more OpenMP threads
than cores libgomp stops spinning and sleeps on a futex at every parallel region
(thousands of context switches per call). On 2 CPU cores that made the loop's
engine calls 30-107% slower than ``engine.generate`` on tiny models and ~11% on
SmolLM2-135M with hf (``tests/bench/bench_generation.py``, ``bench_smollm2.py``).
"""

from __future__ import annotations

import asyncio
import functools
import queue
from concurrent.futures import Executor, Future

from skyrl.inference.base import Completion, SamplingParams


class CallerThread(Executor):
    """Runs submitted calls on the thread that calls ``serve``, until ``shutdown``."""

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = Future()
        self._calls.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._calls.put(None)

    def serve(self) -> None:
        """Run the submitted calls here, in order, until ``shutdown``. A KeyboardInterrupt
        fails the call it interrupted and ends serving."""
        while (call := self._calls.get()) is not None:
            future, fn = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:
                future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                future.set_result(result)


class RequestBatcher:
    """Collects ``(prompt_ids, sampling, route_key)`` requests into engine batches."""

    def __init__(self, engine, max_wait_s: float = 0.02, engine_calls: Executor | None = None):
        self.engine = engine
        self.max_wait_s = max_wait_s
        self.engine_calls = engine_calls
        """Where engine calls run; None = the event loop's default thread pool."""
        self.active = 0
        self.pending: list[tuple[list[int], SamplingParams, str, asyncio.Future]] = []
        self.running = False
        self._timer: asyncio.TimerHandle | None = None
        self.num_engine_calls = 0

    def enter(self) -> None:
        """A trajectory starts (it will ask for turns)."""
        self.active += 1

    def exit(self) -> None:
        """A trajectory ends; the others may now be all waiting."""
        self.active -= 1
        self._maybe_flush()

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str
    ) -> Completion:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((prompt_ids, sampling, route_key, fut))
        self._maybe_flush()
        return await fut

    def _maybe_flush(self) -> None:
        if self.running or not self.pending:
            return
        if len(self.pending) >= self.active:
            self._launch()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if not self.running and self.pending:
            self._launch()

    def _launch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self.pending = self.pending, []
        self.running = True
        asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch) -> None:
        prompts = [b[0] for b in batch]
        params = [b[1] for b in batch]
        keys = [b[2] for b in batch]
        self.num_engine_calls += 1
        routed = {"route_keys": keys} if hasattr(self.engine, "route") else {}
        call = functools.partial(self.engine.generate, prompts, params, **routed)
        try:
            out = await asyncio.get_running_loop().run_in_executor(self.engine_calls, call)
        except BaseException as exc:  # every waiter sees the engine failure
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        else:
            for (*_, fut), group in zip(batch, out, strict=True):
                if not fut.done():
                    fut.set_result(group[0])
        finally:
            self.running = False
            self._maybe_flush()
