"""An ``AsyncRollouts`` whose rollout driver fails to start (user code) stops the event loop
it started: each failed attempt left a thread running an event loop for good (a notebook
retrying a broken driver gathered one per try)."""

from __future__ import annotations

import threading

import pytest
from async_helpers import EchoEngine, async_cfg, tokenizer_of

from skyrl.rollouts.async_rollouts import AsyncRollouts


class BrokenDriver:
    """A driver factory whose setup fails."""

    def __init__(self, ctx):
        raise RuntimeError("my driver's setup failed")


def _loop_threads() -> int:
    return sum(t.name == "skyrl-async-rollouts" for t in threading.enumerate())


def test_a_driver_that_fails_to_start_leaves_no_event_loop_thread():
    cfg = async_cfg("trainer.max_staleness=1", f"generator.agent={__name__}.BrokenDriver")
    tok = tokenizer_of(cfg)
    before = _loop_threads()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="my driver's setup failed"):
            AsyncRollouts(cfg, EchoEngine(tok), tok)
    assert _loop_threads() == before
