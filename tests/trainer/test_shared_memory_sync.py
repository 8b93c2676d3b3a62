"""When the shared-memory weight sync steps aside: no room in /dev/shm (a container's is
often 64 MB) or a Ray cluster of several nodes. ``auto`` falls back to the object store
and says why; an explicit ``trainer.weight_sync=shared_memory`` is one clear error, also when
another run takes the room between the measure and the file. A dead run's leftover file is
swept before the room is measured."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import skyrl
from skyrl.config.errors import ConfigError
from skyrl.config.validate import validate
from skyrl.inference.shared_weights import PREFIX
from skyrl.inference.weight_sync import plan_buckets, tensor_spec
from skyrl.trainer import weight_sync

PLAN = plan_buckets([tensor_spec("w", [1000, 1000], torch.float32)], 1 << 20)
"""4,000,000 bytes of weights."""


@pytest.fixture
def cfg(monkeypatch):
    monkeypatch.setattr(weight_sync, "sync_plan", lambda policy, cfg: PLAN)
    return validate(skyrl.compose([]))


def test_auto_falls_back_to_the_object_store_when_dev_shm_is_too_small(cfg, monkeypatch, capsys):
    monkeypatch.setattr(weight_sync, "free_bytes", lambda directory: 3_000_000)
    assert weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False) is None
    out = capsys.readouterr().out
    assert "weight sync: object store (/dev/shm has 3 MB free, the weights need 4 MB)" in out


def test_explicit_shared_memory_without_room_names_the_key(cfg, monkeypatch):
    monkeypatch.setattr(weight_sync, "free_bytes", lambda directory: 3_000_000)
    with pytest.raises(ConfigError, match="docker run --shm-size") as e:
        weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=True)
    assert e.value.key == "trainer.weight_sync"


def test_auto_falls_back_on_a_cluster_of_several_nodes(cfg, monkeypatch, capsys):
    nodes = [{"Alive": True}, {"Alive": True}, {"Alive": False}]
    monkeypatch.setattr(weight_sync.ray, "nodes", lambda: nodes)
    assert weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False) is None
    assert "the Ray cluster has 2 nodes" in capsys.readouterr().out


def test_with_room_on_one_node_the_file_is_made_for_the_plan(cfg, monkeypatch):
    monkeypatch.setattr(weight_sync.ray, "nodes", lambda: [{"Alive": True}])
    sync = weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False)
    assert sync is not None and sync.weights.nbytes == 4_000_000
    path = Path(sync.weights.path)
    assert path.parent == weight_sync.SHM_DIR and path.stat().st_size == 4_000_000
    sync.loaded()  # the name goes after the first load ...
    assert not path.exists()
    sync.close()  # ... and close is safe after it


def test_a_dead_runs_leftover_is_swept_before_the_room_is_measured(cfg, monkeypatch, tmp_path):
    """A run killed during its first sync leaves its full-size file (nobody holds it)."""
    monkeypatch.setattr(weight_sync, "SHM_DIR", tmp_path)
    monkeypatch.setattr(weight_sync.ray, "nodes", lambda: [{"Alive": True}])
    leftover = tmp_path / f"{PREFIX}{2**22 + 1}-abcd1234"  # above any pid: its run is gone
    leftover.touch()
    os.truncate(leftover, 4_000_000)

    def free_bytes(directory: Path) -> int:
        """A 6 MB /dev/shm: 6 - 4 = 2 MB free with the leftover (less than the 4 MB the
        weights need), 6 MB once it is gone."""
        return 6_000_000 - sum(p.stat().st_size for p in directory.iterdir())

    monkeypatch.setattr(weight_sync, "free_bytes", free_bytes)
    sync = weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=True)
    assert not leftover.exists()
    path = Path(sync.weights.path)
    assert path.parent == tmp_path and path.stat().st_size == 4_000_000
    sync.close()


def _no_room(fd: int, offset: int, length: int) -> None:
    """/dev/shm filled up by another run between the measure and the file."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_explicit_shared_memory_filled_meanwhile_names_the_key(cfg, monkeypatch, tmp_path):
    monkeypatch.setattr(weight_sync, "SHM_DIR", tmp_path)
    monkeypatch.setattr(weight_sync.ray, "nodes", lambda: [{"Alive": True}])
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    with pytest.raises(ConfigError, match="the weights need 4 MB") as e:
        weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=True)
    assert e.value.key == "trainer.weight_sync"
    assert list(tmp_path.iterdir()) == []  # no half-made file left


def test_auto_falls_back_when_dev_shm_filled_meanwhile(cfg, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(weight_sync, "SHM_DIR", tmp_path)
    monkeypatch.setattr(weight_sync.ray, "nodes", lambda: [{"Alive": True}])
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    assert weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False) is None
    assert "weight sync: object store (" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
