"""Ctrl-C while an in-process engine serves (``run_serving``): the interrupt reaches the
caller, and the interrupted rollouts end there. Before, ``KeyboardInterrupt`` was set on
the requests' futures: the rollout tasks re-raised it inside the event loop, which outlived
the run on its thread, and the next run in the process (a notebook's second training run)
logged "Task exception was never retrieved" / "Task was destroyed but it is pending!" with
the old interrupt's traceback, and decoded the requests the interrupted run had queued."""

import asyncio
import gc
import logging
import threading
import time

import pytest

from skyrl.inference.base import SamplingParams
from skyrl.inference.hf import HFEngine
from skyrl.inference.local import run_serving
from skyrl.models import build_tiny_model


@pytest.fixture(scope="module")
def engine():
    return HFEngine(build_tiny_model(), max_batch_size=2)


def test_an_interrupted_serve_leaves_nothing_pending(engine, monkeypatch, caplog):
    greedy = SamplingParams(temperature=0.0, max_tokens=3)
    decode = engine._decode
    batches: list[int] = []

    def interrupted(prompts, params):  # Ctrl-C in the first batch's decode
        batches.append(len(prompts))
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "_decode", interrupted)
    outcomes: list[str] = []

    async def rollout(i: int) -> None:
        try:
            await engine.generate([1, 2, 3 + i], greedy)
            outcomes.append("completed")
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            raise

    async def tool_call() -> None:  # a task not waiting on the engine
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            raise

    async def run() -> None:
        # 5 requests with max_batch_size 2: one batch decoding, the rest queued or pending
        await asyncio.gather(*(rollout(i) for i in range(5)), asyncio.create_task(tool_call()))

    caplog.set_level(logging.ERROR, logger="asyncio")
    with pytest.raises(KeyboardInterrupt):
        run_serving(engine, run())
    assert not [t for t in threading.enumerate() if t.name == "skyrl-rollouts"]
    assert outcomes == ["cancelled"] * 6  # 5 rollouts + the tool call, none left pending

    monkeypatch.setattr(engine, "_decode", lambda p, s: (batches.append(len(p)), decode(p, s))[1])
    second = run_serving(engine, engine.generate([7, 8, 9], greedy))
    gc.collect()
    assert len(second.token_ids) == 3
    assert batches == [2, 1]  # the next run decodes its own request only
    assert [r.getMessage() for r in caplog.records] == []


def test_a_control_call_queued_when_serving_is_interrupted_fails_instead_of_hanging(
    engine, monkeypatch
):
    """A weight update from another thread waits in the inbox for the serving thread. When
    serving was interrupted, it was dropped unanswered: its caller waited forever (and with
    it, the rollouts' event loop, which waits for its ``to_thread`` workers on closing)."""
    weights = [(n, p.detach().clone()) for n, p in engine.model.named_parameters()]
    ran = threading.Event()

    def interrupted(prompts, params):  # Ctrl-C once the update is queued behind the batch
        deadline = time.monotonic() + 5
        while engine._inbox.qsize() == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "_decode", interrupted)
    monkeypatch.setattr(engine, "_load_weights", lambda w: ran.set())
    errors: list[BaseException] = []

    def update() -> None:
        try:
            engine.update_weights(weights)
        except BaseException as exc:
            errors.append(exc)

    async def run() -> None:
        request = asyncio.ensure_future(engine.generate([1, 2, 3], SamplingParams(max_tokens=3)))
        await asyncio.sleep(0.01)  # the request is in the batch being decoded
        await asyncio.gather(request, asyncio.to_thread(update))

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_serving(engine, run())
    assert time.monotonic() - started < 5  # not CANCEL_WAIT_S (10 s) waiting on the update
    assert not ran.is_set()
    [error] = errors
    assert isinstance(error, RuntimeError)
    assert str(error) == "the engine stopped serving (KeyboardInterrupt) before this call ran"
