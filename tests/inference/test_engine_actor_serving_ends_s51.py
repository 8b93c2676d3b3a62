"""An engine actor whose serving thread ended on an error fails every later request at once.

Before: the first request got the engine's error, and every later ``generate`` on that actor
was queued for a serving thread that no longer existed and waited forever (a notebook that
retried after a failed step hung; so did an evaluation after a failed rollout).
"""

import asyncio
from concurrent.futures import Future

import pytest
import torch

from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.client import EngineActor
from skyrl.inference.local import LocalEngine


class _StepFails(LocalEngine):
    """Answers nothing: its first engine step raises (as a vLLM step that runs out of memory),
    which ends serving."""

    def _serve_until(self, done: Future) -> None:
        while not done.done():
            if self.take(block=True):
                raise RuntimeError("engine step failed: out of memory")

    def shutdown(self) -> None:
        pass


class _Answers(LocalEngine):
    """Answers every request with its prompt's first token; serves until ``done``."""

    def _serve_until(self, done: Future) -> None:
        while not done.done():
            for request in self.take(block=True):
                request.resolve(Completion([request.prompt_ids[0]], [0.0], "length"))

    def shutdown(self) -> None:
        pass


def _generate(actor: EngineActor, prompt: list[int]) -> Completion:
    async def one() -> Completion:
        return await asyncio.wait_for(actor.generate(prompt, SamplingParams(max_tokens=1)), 10)

    return asyncio.run(one())


def test_requests_after_serving_ended_fail_at_once():
    actor = EngineActor(_StepFails, {}, num_threads=torch.get_num_threads())
    with pytest.raises(RuntimeError, match="out of memory"):
        _generate(actor, [1, 2])
    actor._thread.join(timeout=10)
    assert not actor._thread.is_alive()
    # the serving thread is gone: the next request is refused, naming the first error,
    # instead of waiting for a thread that will never take it (asyncio.TimeoutError before)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="stopped serving.*out of memory"):
            _generate(actor, [3])
    actor.shutdown()


def test_a_serving_actor_still_answers():
    actor = EngineActor(_Answers, {}, num_threads=torch.get_num_threads())
    assert _generate(actor, [7, 8]).token_ids == [7]
    assert _generate(actor, [9]).token_ids == [9]
    actor.shutdown()
    actor._thread.join(timeout=10)
    assert not actor._thread.is_alive()
