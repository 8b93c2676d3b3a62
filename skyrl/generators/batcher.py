"""Micro-batching of per-trajectory generate requests into batched engine calls.

Each trajectory awaits ``generate`` for one turn at a time; the batcher sends
everything pending as ONE engine call as soon as every live trajectory is
waiting (lock-step turns batch fully), or after ``max_wait_s`` when some are
still busy in their env. One engine call is in flight at a time; it runs in a
thread so env steps keep going meanwhile.
"""

from __future__ import annotations

import asyncio

from skyrl.inference.base import Completion, SamplingParams


class RequestBatcher:
    """Collects ``(prompt_ids, sampling, route_key)`` requests into engine batches."""

    def __init__(self, engine, max_wait_s: float = 0.02):
        self.engine = engine
        self.max_wait_s = max_wait_s
        self.active = 0
        self.pending: list[tuple[list[int], SamplingParams, str, asyncio.Future]] = []
        self.running = False
        self._timer: asyncio.TimerHandle | None = None
        self.engine_calls = 0

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
        self.engine_calls += 1
        try:
            if hasattr(self.engine, "route"):
                out = await asyncio.to_thread(
                    self.engine.generate, prompts, params, route_keys=keys
                )
            else:
                out = await asyncio.to_thread(self.engine.generate, prompts, params)
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
