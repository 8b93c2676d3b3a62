"""``trainer.weight_sync_timeout_s`` with an in-process engine (the CPU default: one hf engine in
the driver): the load runs on the driver's thread, but the weights it loads come from policy
rank 0, another process; a rank 0 that never delivers them ended the run only at its own
timeouts (none, for the object store), the configured timeout was not applied at all. The
trainer is built with ``__new__`` around a real ``EngineSync``; policy rank 0 is a stand-in whose
weights never come."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from skyrl.trainer.checkpoint import CheckpointManager
from skyrl.trainer.trainer import RLTrainer, WeightSyncTimedOut
from skyrl.trainer.weight_sync import EngineSync

STUCK_S = 3.0


class StuckRank0:
    """A policy group whose rank 0 sends its buckets once ``release`` is set, or after
    ``STUCK_S`` (long past the timeout: a trainer that does not apply it gets them then)."""

    def __init__(self):
        self.release = threading.Event()

    def stream_weight_buckets(self, bucket_bytes: int):
        self.release.wait(STUCK_S)
        yield {"w": torch.ones(2)}


class Engine:
    def __init__(self):
        self.loaded: list = []

    def update_weights(self, weights) -> None:
        self.loaded.append(weights)

    def reset_prefix_cache(self) -> None:
        pass


def in_process_trainer(tmp_path: Path, policy, max_staleness: int = 0) -> RLTrainer:
    tr = RLTrainer.__new__(RLTrainer)
    tr.cfg = SimpleNamespace(
        trainer=SimpleNamespace(
            weight_sync_timeout_s=0.3, max_staleness=max_staleness, weight_sync_bucket_mb=1
        ),
        generator=SimpleNamespace(engines_in_actors=False),
    )
    tr.policy, tr.engine = policy, Engine()
    tr.rollouts = SimpleNamespace(
        updating_weights=lambda version, timeout: contextlib.nullcontext()
    )
    tr.engine_sync = EngineSync(policy, tr.engine, tr.rollouts, tr.cfg)
    tr.checkpoints = CheckpointManager(tmp_path / "checkpoints", 2)
    tr.step, tr.policy_version = 3, 2
    return tr


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_sync_whose_rank_0_never_sends_ends_within_the_timeout(tmp_path, max_staleness):
    policy = StuckRank0()
    tr = in_process_trainer(tmp_path, policy, max_staleness)
    started = time.monotonic()
    try:
        with pytest.raises(WeightSyncTimedOut) as info:
            tr.sync_weights(3)
    finally:
        policy.release.set()  # the stand-in's thread ends
    assert time.monotonic() - started < STUCK_S  # 0.3 s and a thread's start
    line = str(info.value)
    assert "\n" not in line
    assert "trainer.weight_sync_timeout_s=0.3" in line
    assert "policy rank 0 to stage the weights (object store)" in line
    assert "stopped at step 3; no checkpoint was saved" in line
    assert tr.policy_version == 2  # the engines never got version 3
    assert tr.engine.loaded == []


def test_a_sync_within_the_timeout_loads_the_staged_weights(tmp_path):
    policy = StuckRank0()
    policy.release.set()
    tr = in_process_trainer(tmp_path, policy)
    tr.sync_weights(3)
    [[bucket]] = tr.engine.loaded
    assert torch.equal(bucket["w"], torch.ones(2))
    assert tr.policy_version == 3
