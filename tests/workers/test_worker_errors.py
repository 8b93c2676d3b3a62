"""Worker failures surface as one error naming the role and the rank, not a raw Ray error."""

from __future__ import annotations

import os
import signal
import time

import pytest
from worker_helpers import make_config

from skyrl.workers.group import WorkerDiedError, WorkerGroup
from skyrl.workers.host_memory import MALLOC_ENV

pytestmark = pytest.mark.slow


def test_failures_name_the_role_and_the_rank(ray_cluster, tiny_model_path, tmp_path):
    group = WorkerGroup("policy", make_config(tiny_model_path), total_optimizer_steps=1)
    try:
        # An exception inside a method: the worker lives on, the error names the role.
        with pytest.raises(RuntimeError, match=r"^policy worker failed: "):
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
