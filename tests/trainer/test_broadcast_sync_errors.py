"""A broadcast weight sync that fails: when policy rank 0 (the sender) died, the engines fail
too, with gloo's "Connection reset by peer"; the error raised is the sender's (the dead worker
named by role and rank). An engine that dies or fails on its own keeps its own error, and the
sync does not wait on a sender still blocked in the broadcast."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import ray

from skyrl.inference.client import EngineDiedError
from skyrl.trainer import weight_sync
from skyrl.trainer.weight_sync import BroadcastWeightSync
from skyrl.workers.group import WorkerDiedError

GLOO_RESET = (
    "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:18668: Connection reset by peer"
)
"""What an engine's receive raised, measured here, once the policy worker was killed."""


class _Policy:
    """A ``WorkerGroup`` stand-in whose ``broadcast_weights`` ended with ``outcome``, or is
    still blocked in the broadcast (``blocked``: until ``release`` is set)."""

    def __init__(self, outcome: Exception | None, blocked: bool = False):
        self.outcome, self.blocked = outcome, blocked
        self.release = threading.Event()
        self.returned = False

    def submit(self, method: str, *args) -> list[str]:
        return [f"{method}-rank-0"]

    def get(self, refs: list, timeout: float | None = None) -> list:
        if self.blocked:
            self.release.wait(60)
            self.returned = True
        if self.outcome is not None:
            raise self.outcome
        return [None]


class _FailingEngine:
    def __init__(self, error: Exception):
        self.error = error

    def receive_weights(self, plan: list) -> None:
        raise self.error


def _sync(policy: _Policy, engine_error: Exception | None = None) -> BroadcastWeightSync:
    sync = BroadcastWeightSync.__new__(BroadcastWeightSync)  # no group to open
    sync.policy, sync.plan = policy, [[("w", [2], "float32")]]
    sync.engine = _FailingEngine(engine_error or RuntimeError(GLOO_RESET))
    return sync


def test_a_dead_sender_is_named_instead_of_the_engines_connection_reset():
    died = WorkerDiedError("policy worker rank 0 died: The actor died unexpectedly")
    with pytest.raises(WorkerDiedError) as e:
        _sync(_Policy(died)).sync()
    assert str(e.value) == "policy worker rank 0 died: The actor died unexpectedly"


def test_an_engine_failing_on_its_own_keeps_its_error_without_waiting_for_the_sender(
    monkeypatch,
):
    """The sender is still blocked in the broadcast (it waits for the engines until gloo's
    timeout, 600 s): the sync waits for its result ``SENDER_GRACE_S`` only."""
    monkeypatch.setattr(weight_sync, "SENDER_GRACE_S", 0.5)
    policy = _Policy(None, blocked=True)
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        _sync(policy).sync()
    assert not policy.returned  # 0.5 s of grace, not the sender's 60 s
    policy.release.set()


def test_an_engine_that_died_is_named_not_the_senders_lost_peer():
    """The sender then fails with gloo's reset in its turn; the engine's death is the cause."""
    policy = _Policy(RuntimeError(f"policy worker failed: RuntimeError: {GLOO_RESET}"))
    died = EngineDiedError("inference engine actor died during receive_weights: killed")
    policy.blocked = True  # the sender's error would come after the grace: not waited for
    with pytest.raises(EngineDiedError, match="died during receive_weights: killed"):
        _sync(policy, died).sync()
    assert not policy.returned  # nothing waited for
    policy.release.set()


@pytest.mark.slow
def test_a_killed_policy_worker_is_named_by_the_sync(ray_cluster, tiny_model_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "workers"))
    from worker_helpers import make_config

    from skyrl.inference.client import EngineClient
    from skyrl.inference.hf import HFEngine
    from skyrl.workers.group import WorkerGroup

    cfg = make_config(tiny_model_path, dp_size=1, weight_sync="broadcast")
    policy = WorkerGroup("policy", cfg, total_optimizer_steps=1)
    engine = EngineClient([HFEngine(tiny_model_path)])
    try:
        sync = BroadcastWeightSync(policy, engine, cfg)
        sync.sync()
        ray.kill(policy.actors[0], no_restart=True)
        _wait_until_dead(policy)
        with pytest.raises(WorkerDiedError, match="^policy worker rank 0 died: "):
            sync.sync()
    finally:
        policy.shutdown()
        engine.shutdown()


def _wait_until_dead(policy, timeout_s: float = 30.0) -> None:
    """``ray.kill`` returns before the actor is gone: call it until Ray says it died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            policy.run("weight_sync_address")
        except WorkerDiedError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the killed policy worker still answers after {timeout_s:g} s")
