"""An ``AsyncRollouts`` call interrupted while it waits (Ctrl-C in ``next_batch``) leaves
nothing pending on the stream's loop once the source is closed."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from async_helpers import TimedEngine, async_cfg, tokenizer_of

from skyrl.rollouts.async_rollouts import AsyncRollouts


class Interrupt(Exception):
    """Stands in for ``KeyboardInterrupt``: raised by a signal handler on the waiting thread."""


def test_an_interrupted_next_batch_leaves_no_task_pending_after_close(tmp_path):
    # Every request takes 5 s; SIGALRM interrupts next_batch(1) after 0.3 s, as Ctrl-C would.
    # The wait ended but its task (_take) stayed pending on the loop: close() cancelled only
    # the groups' tasks, stopped the loop, and at exit asyncio printed "Task was destroyed but
    # it is pending!" naming AsyncRollouts._take (a script's skyrl.train after Ctrl-C).
    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, TimedEngine(tok, {}, default_s=5.0), tok, tmp_path)

    def interrupt(signum, frame):
        raise Interrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        with pytest.raises(Interrupt):
            source.next_batch(1)
        assert time.monotonic() - started < 4.0  # interrupted, not answered
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        source.close()
    assert source.loop.is_closed() and not source.thread.is_alive()
    pending = [task.get_coro().__qualname__ for task in asyncio.all_tasks(source.loop)]
    assert pending == []
