"""A broadcast weight sync whose sender, policy rank 0, fails without dying: its error is
raised in seconds and the engines are released. Before, the engines waited in gloo until its
timeout (600 s in a run) and the error raised then was the engine's timeout.

Policy rank 0 is stood in for by a worker whose calls run on threads of this process (its
group is a real gloo group); the engine is a real hf engine."""

from __future__ import annotations

import functools
import re
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

import skyrl.inference.weight_sync as wire
from skyrl.inference.hf import HFEngine
from skyrl.models import build_tiny_model
from skyrl.trainer.weight_sync import BroadcastWeightSync, run_in_thread
from skyrl.workers.distributed import find_free_port
from skyrl.workers.worker import TrainingWorker

RELEASED = re.compile(r"Connection (closed|reset) by peer")
"""What gloo says to an engine whose sender let go of the group."""
PLAN = [[("model.norm.weight", [64], "float32")]]
"""One tensor the tiny model has (hidden size 64)."""
ENGINE_TIMEOUT_S = 20.0
"""The engines' gloo timeout here (600 s in a run): the wait the sync must not sit out."""
CFG = SimpleNamespace(
    trainer=SimpleNamespace(weight_sync_bucket_mb=1, num_gpus_per_worker=0),
    generator=SimpleNamespace(num_engines=1, processes_per_engine=1),
)


class _Rank0:
    """Policy rank 0's weight-sync methods; ``broadcast_weights`` fails before sending, as
    a plan that no longer matches the model does (``_planned_buckets``)."""

    def __init__(self, join_error: Exception | None = None):
        self.join_error = join_error

    def weight_sync_plan(self, bucket_bytes: int) -> list:
        return PLAN

    def weight_sync_address(self) -> tuple[str, int]:
        return "127.0.0.1", find_free_port()

    def join_weight_sync(self, host: str, port: int, world_size: int, backend: str) -> None:
        if self.join_error is not None:
            raise self.join_error
        self.sync_group = wire.join_group(host, port, 0, world_size, backend, timeout_s=60)

    def broadcast_weights(self, plan: list) -> None:
        raise RuntimeError("weight sync plan expects model.norm.weight, model gave lm_head.weight")

    leave_weight_sync = TrainingWorker.leave_weight_sync


class _Handle:
    """A Ray actor handle's shape: ``handle.method.remote(*args)`` runs on a thread."""

    def __init__(self, worker: _Rank0):
        self.worker = worker

    def __getattr__(self, method: str):
        return SimpleNamespace(
            remote=functools.partial(run_in_thread, getattr(self.worker, method))
        )


class _Policy:
    """A ``WorkerGroup`` of one rank: ``submit`` and ``get`` over futures."""

    def __init__(self, worker: _Rank0):
        self.actors = [_Handle(worker)]

    def submit(self, method: str, *args) -> list[Future]:
        return [getattr(self.actors[0], method).remote(*args)]

    def get(self, refs: list[Future], timeout: float | None = None) -> list:
        return [ref.result(timeout) for ref in refs]


@pytest.fixture
def short_engine_timeout(monkeypatch):
    monkeypatch.setattr(
        wire, "join_group", functools.partial(wire.join_group, timeout_s=ENGINE_TIMEOUT_S)
    )


class _Recording:
    """The hf engine, recording how its weight-sync calls ended: the engines released by the
    sender's side closing fail on gloo's "Connection closed by peer" (or "reset by peer"), not
    on its timeout."""

    def __init__(self, engine: HFEngine):
        self.engine = engine
        self.ended: list[str] = []

    def join_weight_sync(self, *args) -> None:
        self._record(self.engine.join_weight_sync, *args)

    def receive_weights(self, plan: list) -> None:
        self._record(self.engine.receive_weights, plan)

    def _record(self, call, *args) -> None:
        try:
            call(*args)
        except Exception as exc:
            self.ended.append(str(exc))
            raise
        self.ended.append("ok")


@pytest.fixture(scope="module")
def hf_engine() -> HFEngine:
    return HFEngine(build_tiny_model())


@pytest.fixture
def engine(hf_engine) -> _Recording:
    return _Recording(hf_engine)


def test_a_sender_failing_before_it_sends_is_raised_at_once(short_engine_timeout, engine):
    sync = BroadcastWeightSync(_Policy(_Rank0()), engine, CFG)
    with pytest.raises(RuntimeError) as e:
        sync.sync()
    assert str(e.value) == ("weight sync plan expects model.norm.weight, model gave lm_head.weight")
    # the engine was released by the sender's side closing, not by its own timeout
    assert engine.ended[0] == "ok" and RELEASED.search(engine.ended[1])
    with pytest.raises(RuntimeError) as again:  # the group is gone: said, not a gloo error
        sync.sync()
    assert str(again.value) == (
        "weight sync: the broadcast group was closed when an earlier sync failed (weight "
        "sync plan expects model.norm.weight, model gave lm_head.weight); it cannot serve "
        "another"
    )


def test_a_sender_failing_to_join_is_raised_at_once(short_engine_timeout, engine):
    """The engine waits for the group until its timeout (nothing can end that wait); the
    construction does not wait with it."""
    taken = OSError("EADDRINUSE: address already in use")
    with pytest.raises(OSError, match="^EADDRINUSE: address already in use$"):
        BroadcastWeightSync(_Policy(_Rank0(join_error=taken)), engine, CFG)
    assert engine.ended == []  # raised while the engine still waited to join
    time.sleep(ENGINE_TIMEOUT_S)  # let the engine's join time out before the process ends


class _MismatchedRank0(_Rank0):
    """``send_bucket`` itself refuses the tensor (its shape is not the plan's): the frame
    that raised holds the group, which must still go when the driver closes it."""

    def broadcast_weights(self, plan: list) -> None:
        import torch

        wire.send_bucket(self.sync_group, plan[0], [torch.zeros(63)])


class _RayPolicy:
    """A ``WorkerGroup`` of one Ray actor."""

    def __init__(self, actor):
        self.actors = [actor]

    def submit(self, method: str, *args) -> list:
        return [getattr(self.actors[0], method).remote(*args)]

    def get(self, refs: list, timeout: float | None = None) -> list:
        import ray

        return ray.get(refs, timeout=timeout)


def test_a_sender_in_a_ray_actor_is_closed_through_ray(short_engine_timeout, engine, ray_cluster):
    """The real path: policy rank 0 is a Ray actor that lets go of the group when told."""
    import sys

    import ray
    from ray import cloudpickle

    # Ray's workers cannot import a test module: ship this one's classes by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    actor = ray.remote(num_cpus=0.1)(_MismatchedRank0).remote()
    try:
        sync = BroadcastWeightSync(_RayPolicy(actor), engine, CFG)
        with pytest.raises(ray.exceptions.RayTaskError) as e:
            sync.sync()
        assert (
            "weight sync: model.norm.weight is [63] torch.float32, the plan says [64] float32"
            in str(e.value)
        )
        assert RELEASED.search(engine.ended[-1])  # released, not timed out
    finally:
        ray.kill(actor, no_restart=True)
