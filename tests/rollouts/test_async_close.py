"""Closing an ``AsyncRollouts`` stream: envs that close slowly, cancels that do not end, the
event loop, an external agent's endpoints; and eval passes counted as engine time."""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import Future

import pytest
from async_helpers import (
    EchoEngine,
    TimedEngine,
    async_cfg,
    next_batch_within,
    tokenizer_of,
    wait_until_line_done,
)

from skyrl.rollouts.async_rollouts import AsyncRollouts
from skyrl.rollouts.sync import SyncRollouts
from skyrl.tracking import metric_names as names


class ClosesSlowly:
    """Done after one step; once ``close_s`` is set, ``close`` on an env thread takes that long
    (a sandbox being stopped; the prompts' load-time check closes its envs on the caller's
    thread, at once). Counts the closes on env threads."""

    close_s = 0.0
    closed = 0
    lock = threading.Lock()

    def __new__(cls, **kwargs):
        from skyrl.envs.base import StepResult, TextEnv

        class Env(TextEnv):
            def step(self, action_text):
                return StepResult([], 1.0, True)

            def close(self):
                if threading.current_thread().name != "skyrl-env":
                    return
                time.sleep(ClosesSlowly.close_s)
                with ClosesSlowly.lock:
                    ClosesSlowly.closed += 1

        return Env(**kwargs)


class Stops:
    """A component of the trainer (worker group, engine, shared weights) recording its stop."""

    def __init__(self, name: str, stopped: list[str]):
        self.name, self.stopped = name, stopped

    def shutdown(self) -> None:
        self.stopped.append(self.name)

    close = shutdown


def test_shutdown_after_an_async_run_does_not_wait_for_envs_to_close(tmp_path):
    # The end of an async run: the next groups' 4 requests (2 prompts x 2 samples) are at a
    # slow engine; 1 env call at a time, each env close 1 s. Each cancelled trajectory awaited
    # its env's close, one after another in the one slot, until each group had one close
    # done: shutdown took 3 x 1 s here (with 12 in flight and closes of 8 s in 2 slots it ran
    # past close's 30 s and RLTrainer.shutdown raised TimeoutError, stopping nothing else), and
    # the closes still queued when the loop stopped never ran. Now the closes run on threads
    # of their own, not waited for.
    from skyrl.trainer.trainer import RLTrainer

    cfg = async_cfg(
        "trainer.max_staleness=1", f"environment._target_={__name__}.ClosesSlowly",
        "environment.max_concurrent_calls=1",
    )  # fmt: skip
    tok = tokenizer_of(cfg)
    engine = TimedEngine(tok, {})
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    ClosesSlowly.close_s, ClosesSlowly.closed = 0.0, 0
    try:
        next_batch_within(source, 1)
        wait_until_line_done(source)  # s1r0p2 s1r0p3 generated, their envs closed
        engine.default_s, ClosesSlowly.close_s, ClosesSlowly.closed = 1000.0, 1.0, 0
        with source.updating_weights(1, timeout_s=10):
            pass  # 2 more prompts admitted: their 4 requests hang at the engine
        deadline = time.monotonic() + 20
        while source.gated.in_flight < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert source.gated.in_flight == 4
        stopped: list[str] = []
        tr = RLTrainer.__new__(RLTrainer)
        tr.rollouts, tr.engine = source, Stops("engine", stopped)
        tr.policy, tr.reference = Stops("policy", stopped), Stops("reference", stopped)
        tr.critic, tr.engine_sync = Stops("critic", stopped), Stops("engine_sync", stopped)
        tr.shutdown()
        closed_by_then = ClosesSlowly.closed  # each close takes 1 s: none ended if none waited
    finally:
        source.close()
        ClosesSlowly.close_s = 0.0
    assert closed_by_then == 0
    assert stopped == ["critic", "reference", "policy", "engine", "engine_sync"]
    assert source.loop.is_closed() and not source.thread.is_alive()
    deadline = time.monotonic() + 10
    while ClosesSlowly.closed < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ClosesSlowly.closed == 4  # every env of the 4 cancelled trajectories, closed anyway


def test_close_gives_up_on_a_cancel_that_does_not_end_and_says_so(tmp_path, caplog):
    # A task on the stream's loop that goes on for 5 s once cancelled: close() waited its 30 s
    # for it and raised TimeoutError. Now it waits timeout_s, warns once and stops the loop.
    import asyncio
    import logging

    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)

    async def stubborn() -> None:
        try:
            await asyncio.sleep(1000)
        except asyncio.CancelledError:
            await asyncio.sleep(5)  # cleaning up, for longer than close waits

    async def spawn() -> None:
        source._spawn(stubborn())

    source._on_loop(spawn())
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="skyrl.rollouts.async_rollouts"):
        source.close(timeout_s=0.2)
    assert time.monotonic() - started < 2.0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "0.2 s" in warned[0]
    assert source.loop.is_closed() and not source.thread.is_alive()


def test_close_closes_the_event_loop(tmp_path):
    # The loop was stopped, never closed: ResourceWarning "unclosed event loop" at exit.
    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    next_batch_within(source, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        source.close()
        source.close()  # twice: nothing more
    assert source.loop.is_closed() and not source.thread.is_alive()


def test_an_eval_pass_is_engine_time_not_idle_time(tmp_path):
    # Each eval request takes 1 s at the engine; the eval runs while a weight sync holds the
    # stream's requests (its requests are not held: it returns). The engine is busy for those
    # ~1 s: it counted as idle (async/engine_idle_s >= 1.0). Counted busy, step 2's idle time
    # is the little between the stream's requests: well under 0.5 s.
    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    engine = TimedEngine(tok, {f"eval{i}": 1.0 for i in range(4)})
    source = AsyncRollouts(cfg, engine, tok, tmp_path)
    evaluated: Future = Future()
    try:
        next_batch_within(source, 1)
        wait_until_line_done(source)
        sync = source.updating_weights(1, timeout_s=10)  # holds new requests from here
        threading.Thread(
            target=lambda: evaluated.set_result(source.evaluate()), daemon=True
        ).start()
        metrics_eval = evaluated.result(20)  # not held by the sync's gate
        with sync:
            pass
        _, metrics = next_batch_within(source, 2)
    finally:
        source.close()
    assert metrics_eval["eval/seconds"] >= 1.0
    assert metrics[names.ASYNC_ENGINE_IDLE_S] < 0.5


async def one_request(client, row) -> float:
    """An external agent: one request, reward 1."""
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return 1.0


def accepts_connections(server) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex((server.host, server.port)) == 0


@pytest.mark.parametrize("staleness", [0, 1])
def test_closing_the_source_stops_an_external_agents_endpoints(tmp_path, staleness):
    # generator.agent naming an async function: its driver serves an OpenAI endpoint on a
    # thread of its own (one for the stream, one for the eval pass of the async source).
    # Neither source stopped them: each run left its endpoints listening.
    cfg = async_cfg(f"trainer.max_staleness={staleness}", f"generator.agent={__name__}.one_request")
    tok = tokenizer_of(cfg)
    if staleness:
        source = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    else:
        source = SyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    try:
        batch, _ = next_batch_within(source, 1)
        assert batch.require("rewards").sum().item() == 4.0  # 2 prompts x 2 samples, reward 1
        source.evaluate()
        servers = [source.generator.driver.server]
        if staleness:
            servers.append(source.eval_generator.driver.server)
        assert len({id(s) for s in servers}) == len(servers)
        assert all(accepts_connections(s) for s in servers)
    finally:
        source.close()
    assert not any(accepts_connections(s) for s in servers)
