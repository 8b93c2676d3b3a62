"""Weight sync through one shared-memory file: policy rank 0 writes, the engines read views.

When policy rank 0 and the engines run on the CPUs of one machine, a sync needs no
transport at all. The driver creates one file in ``/dev/shm`` sized for the full
weights, laid out as the sync *plan* says (``skyrl.inference.weight_sync``: the
buckets in the model's order, each tensor on a 16-byte boundary). Each sync, rank 0
copies its parameters into the file (one memcpy) and every engine loads from views
of it (its own copy into the model: the only other copy). Nothing is pickled, and
only the small ``SharedWeights`` handle (path and plan) crosses Ray or vLLM's
RPC, so the engine may live in the driver, in a Ray actor or in vLLM's worker
processes.

Each process maps the file once (``_MAPS``) and keeps the mapping. After the first
sync every process that needs the file has mapped it, and the driver unlinks the
name (``SharedWeights.unlink``): the memory then lives exactly as long as some
process maps it, so a killed run leaves nothing behind in ``/dev/shm``. Until then the
driver holds a shared ``flock`` on the file (``_LOCKS``); a file left by a driver that died
before its first sync is unlocked, and the next run of the same user removes it
(``sweep_stale``). The lock, not the pid in the name, tells a file in use: a run in another
container that shares ``/dev/shm`` (docker ``--ipc=host``) has pids of its own.

Readers must be done with a sync's views before rank 0 writes the next one: the
trainer's syncs are sequential (the next sync waits for a background load).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from skyrl.inference.weight_sync import Plan, TensorSpec, bucket_offsets, spec_nbytes

SHM_DIR = Path("/dev/shm")
"""Where the file lives: a tmpfs on Linux, so the file is memory, never disk."""
PREFIX = "skyrl-weights-"
"""File names: ``skyrl-weights-<driver pid>-<random>`` (the pid is for people reading
``ls /dev/shm``; ``sweep_stale`` goes by the lock)."""

_MAPS: dict[str, torch.Tensor] = {}
"""This process's mappings, by path: mapped on first use, kept until ``release``."""
_LOCKS: dict[str, int] = {}
"""Descriptors of the files this process made, each holding a shared ``flock`` (in use: not
to be swept) until the name goes (``unlink``) or the process ends."""


class SharedWeightsMissing(RuntimeError):
    """The shared-memory weight file is not on this machine (another node, or removed)."""


@dataclass(frozen=True)
class SharedWeights:
    """A handle on the shared weight file: picklable, small, and iterable as
    ``(name, tensor)`` views of the file (a ``WeightItems`` for ``update_weights``)."""

    path: str
    plan: Plan

    @cached_property
    def _layout(self) -> tuple[tuple[int, ...], int]:
        offsets, nbytes = layout(self.plan)
        return tuple(offsets), nbytes

    @property
    def offsets(self) -> tuple[int, ...]:
        """Byte offset of each tensor of ``plan``, in the plan's order."""
        return self._layout[0]

    @property
    def nbytes(self) -> int:
        """The file's size."""
        return self._layout[1]

    def specs(self) -> list[TensorSpec]:
        return [spec for bucket in self.plan for spec in bucket]

    def __iter__(self):
        buffer = self._buffer()
        for spec, offset in zip(self.specs(), self.offsets, strict=True):
            raw = buffer[offset : offset + spec_nbytes(spec)]
            yield spec[0], raw.view(getattr(torch, spec[2])).view(spec[1])

    def write(self, start: int, tensors: list[torch.Tensor]) -> None:
        """Copy ``tensors`` (the plan's tensors ``start``, ``start + 1``, ...) into the file."""
        buffer = self._buffer()
        specs = self.specs()
        for i, tensor in enumerate(tensors, start=start):
            name, shape, dtype = specs[i]
            if list(tensor.shape) != shape or str(tensor.dtype) != f"torch.{dtype}":
                raise ValueError(
                    f"shared weights: {name} is {list(tensor.shape)} {tensor.dtype}, "
                    f"the plan says {shape} {dtype}"
                )
            flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
            buffer[self.offsets[i] : self.offsets[i] + flat.numel()].copy_(flat)

    def _buffer(self) -> torch.Tensor:
        mapped = _MAPS.get(self.path)
        if mapped is None:
            try:
                size = os.stat(self.path).st_size
            except FileNotFoundError:
                raise SharedWeightsMissing(
                    f"shared-memory weight file {self.path} is not on this machine "
                    f"(pid {os.getpid()}): the engines and policy rank 0 must share one "
                    "machine for trainer.weight_sync=shared_memory; use object_store"
                ) from None
            if size != self.nbytes:
                raise SharedWeightsMissing(
                    f"shared-memory weight file {self.path} holds {size} bytes, "
                    f"expected {self.nbytes}"
                )
            mapped = torch.from_file(self.path, shared=True, size=self.nbytes, dtype=torch.uint8)
            _MAPS[self.path] = mapped
        return mapped

    def unlink(self) -> None:
        """Remove the file's name; processes that mapped it keep the memory. With the name
        gone no sweep can find the file, so its maker lets go of the lock."""
        Path(self.path).unlink(missing_ok=True)
        lock = _LOCKS.pop(self.path, None)
        if lock is not None:
            os.close(lock)

    def release(self) -> None:
        """Unlink and drop this process's mapping."""
        self.unlink()
        _MAPS.pop(self.path, None)


def layout(plan: Plan) -> tuple[list[int], int]:
    """Byte offset of every tensor of ``plan`` in the file (its buckets back to back), and
    the file's size."""
    offsets: list[int] = []
    pos = 0
    for bucket in plan:
        starts, total = bucket_offsets(bucket)
        offsets.extend(pos + s for s in starts)
        pos += total
    return offsets, pos


def free_bytes(directory: Path = SHM_DIR) -> int:
    """Room left in ``directory`` (0 where it does not exist). A container's /dev/shm is often
    small (64 MB in docker by default): writing past it kills the writer with SIGBUS."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


def create_shared_weights(plan: Plan, directory: Path = SHM_DIR) -> SharedWeights:
    """A new zero-filled file sized for ``plan``, its memory taken (``OSError`` ENOSPC where
    /dev/shm has no room), and its handle; this process holds the file's lock until
    ``unlink``. The file is made under a name no sweep looks at (a leading dot) and
    takes its own name only once locked, so no sweep ever sees it unlocked."""
    sweep_stale(directory)
    name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path, draft = directory / name, directory / f".{name}"
    weights = SharedWeights(str(path), plan)
    fd = os.open(draft, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.rename(draft, path)  # the same file: the lock stays
        os.ftruncate(fd, weights.nbytes)
        if weights.nbytes:  # take the memory now: a sparse file takes it at rank 0's write,
            # where another run's file may have taken the room meanwhile (SIGBUS, no message)
            os.posix_fallocate(fd, 0, weights.nbytes)
    except BaseException:
        os.close(fd)
        draft.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise
    _LOCKS[str(path)] = fd
    return weights


def sweep_stale(directory: Path = SHM_DIR) -> list[Path]:
    """Remove this user's weight files that no process holds (left by a driver that died
    before its first sync); returns what was removed. Other users' files stay: /dev/shm is
    sticky, only a file's owner may remove it."""
    return [path for path in sorted(directory.glob(f"{PREFIX}*")) if _remove_if_unused(path)]


def weight_files(directory: Path = SHM_DIR) -> list[tuple[Path, int]]:
    """The weight files in ``directory`` and their sizes in bytes: after ``sweep_stale``, those
    of live runs and other users' (what a user must know of when /dev/shm is short)."""
    files = []
    for path in sorted(directory.glob(f"{PREFIX}*")):
        try:
            files.append((path, path.lstat().st_size))
        except OSError:  # gone meanwhile
            continue
    return files


def _remove_if_unused(path: Path) -> bool:
    try:
        if path.lstat().st_uid != os.getuid():
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # gone meanwhile, or not ours to open
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its maker holds it
        os.unlink(path)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
