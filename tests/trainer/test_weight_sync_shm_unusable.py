"""A /dev/shm the shared-memory weight sync cannot use for another reason than its size: not
writable (a read-only or root-only mount), absent (not Linux), or a shortfall too small to
show in whole MB. ``auto`` falls back to the object store and says why in one line; an
explicit ``trainer.weight_sync=shared_memory`` is a ``ConfigError`` naming the key and the
directory."""

from __future__ import annotations

import errno
import os

import pytest
import torch

import skyrl
from skyrl.config.errors import ConfigError
from skyrl.config.validate import validate
from skyrl.inference.weight_sync import plan_buckets, tensor_spec
from skyrl.trainer import weight_sync

PLAN = plan_buckets([tensor_spec("w", [1000, 1000], torch.float32)], 1 << 20)
"""1000 * 1000 * 4 = 4,000,000 bytes of weights."""


@pytest.fixture
def cfg(monkeypatch, tmp_path):
    monkeypatch.setattr(weight_sync, "sync_plan", lambda policy, cfg: PLAN)
    monkeypatch.setattr(weight_sync, "SHM_DIR", tmp_path)
    monkeypatch.setattr(weight_sync.ray, "nodes", lambda: [{"Alive": True}])
    return validate(skyrl.compose([]))


@pytest.fixture
def read_only(monkeypatch, tmp_path):
    """``tmp_path`` refuses new files, as a read-only /dev/shm does (even to root)."""
    real_open = os.open

    def refusing_open(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)


def test_auto_falls_back_when_dev_shm_is_not_writable(cfg, read_only, tmp_path, capsys):
    assert weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False) is None
    out = capsys.readouterr().out
    line = f"weight sync: object store (cannot make the weight file in {tmp_path}: Read-only"
    assert f"{line} file system)\n" in out


def test_explicit_shared_memory_on_a_read_only_dev_shm_names_the_key_and_dir(cfg, read_only):
    with pytest.raises(ConfigError) as e:
        weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=True)
    assert e.value.key == "trainer.weight_sync"
    assert str(e.value).splitlines() == [
        "trainer.weight_sync: shared_memory: cannot make the weight file in "
        f"{weight_sync.SHM_DIR}: Read-only file system; use trainer.weight_sync=object_store"
    ]


def test_a_missing_dev_shm_is_named_as_missing(cfg, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(weight_sync, "SHM_DIR", tmp_path / "shm")
    assert weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False) is None
    assert f"weight sync: object store ({tmp_path / 'shm'} does not exist)" in (
        capsys.readouterr().out
    )


def test_a_shortfall_under_a_megabyte_shows_the_bytes(cfg, monkeypatch, capsys):
    """3,900,000 free and 4,000,000 needed both round to "4 MB": the line would refuse 4 MB
    for want of 4 MB; it gives the bytes instead."""
    monkeypatch.setattr(weight_sync, "free_bytes", lambda directory: 3_900_000)
    assert weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False) is None
    out = capsys.readouterr().out
    assert "has 3,900,000 bytes free, the weights need 4,000,000 bytes)" in out


def test_the_weight_files_of_other_runs_taking_the_room_are_named(
    cfg, monkeypatch, tmp_path, capsys
):
    """A live run's file (or another user's leftover) cannot be swept: the line names it, so
    the user sees what holds /dev/shm."""
    import fcntl

    from skyrl.inference.shared_weights import PREFIX

    held = tmp_path / f"{PREFIX}4242-abcd1234"
    held.touch()
    os.truncate(held, 3_000_000)
    monkeypatch.setattr(weight_sync, "free_bytes", lambda directory: 2_000_000)
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # in use: its run is alive
    try:
        assert weight_sync.SharedMemoryWeightSync.start(None, cfg, explicit=False) is None
    finally:
        os.close(fd)
    assert held.exists()
    assert (
        f"weight sync: object store ({tmp_path} has 2 MB free, the weights need 4 MB; "
        f"weight files of other skyrl runs there: {held} (3 MB))\n"
    ) in capsys.readouterr().out
