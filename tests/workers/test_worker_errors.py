"""Worker failures surface as one error naming the role and the rank, not a raw Ray error."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from worker_helpers import make_config

import skyrl.workers.group as group_module
from skyrl.workers.distributed import find_free_port
from skyrl.workers.group import WorkerDiedError, WorkerGroup
from skyrl.workers.host_memory import MALLOC_ENV

pytestmark = pytest.mark.slow


def test_failures_name_the_role_and_the_rank(ray_cluster, tiny_model_path, tmp_path):
    group = WorkerGroup("policy", make_config(tiny_model_path), total_optimizer_steps=1)
    try:
        # An exception inside a method: the worker lives on, the error names the role and rank.
        # its type stays in the line: a bare KeyError would print as just the key
        with pytest.raises(RuntimeError, match=r"^policy worker rank [01] failed: \w*Error\b"):
            group.run("load_checkpoint", str(tmp_path / "missing"))
        assert group.run("global_steps") == [0, 0]

        pids = group.run("pid")
        for pid in pids:  # every rank started with the malloc tuning (glibc reads it at start)
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            for key, value in MALLOC_ENV.items():
                assert environ.get(key.encode()) == value.encode(), key

        # A killed process: the error names the role and the dead rank.
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        with pytest.raises(WorkerDiedError, match=r"^policy worker rank 1 died: ") as info:
            while time.monotonic() < deadline:  # until Ray notices the death
                group.run("global_steps")
                time.sleep(0.2)
        assert info.value.__cause__ is None  # one short error, not Ray's chained traceback
    finally:
        group.shutdown()


def test_a_taken_rendezvous_port_starts_the_group_again(ray_cluster, tiny_model_path, monkeypatch):
    """Rank 0 binds the TCPStore port the driver picked seconds before; if another process
    bound it first (EADDRINUSE, seen in CI), the group starts again on a new port, and a start
    that keeps failing names the cause, not Ray's "error raised in its creation task"."""
    cfg = make_config(tiny_model_path, dp_size=1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        picked: list[int] = []
        monkeypatch.setattr(group_module, "START_ATTEMPTS", 2)
        monkeypatch.setattr(group_module, "find_free_port", lambda: picked.pop(0))

        picked[:] = [port, port]  # taken at both attempts
        with pytest.raises(
            WorkerDiedError, match=r"^policy worker rank 0 failed to start: "
        ) as info:
            WorkerGroup("policy", cfg, total_optimizer_steps=1)
        assert "address already in use" in str(info.value) and picked == []

        picked[:] = [port, find_free_port()]  # taken once: the second start binds a free port
        group = WorkerGroup("policy", cfg, total_optimizer_steps=1)
        try:
            assert picked == [] and group.run("global_steps") == [0]
        finally:
            group.shutdown()
