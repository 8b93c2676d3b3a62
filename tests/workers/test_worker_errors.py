"""Worker failures surface as one error naming the role and the rank, not a raw Ray error."""

from __future__ import annotations

import os
import signal
import time

import pytest
from worker_helpers import make_config

from skyrl.workers.group import WorkerDiedError, WorkerGroup

pytestmark = pytest.mark.slow


def test_failures_name_the_role_and_the_rank(ray_cluster, tiny_model_path, tmp_path):
    group = WorkerGroup("policy", make_config(tiny_model_path), total_optimizer_steps=1)
    try:
        # An exception inside a method: the worker lives on, the error names the role.
        with pytest.raises(RuntimeError, match=r"^policy worker failed: "):
            group.run("load_checkpoint", str(tmp_path / "missing"))
        assert group.run("global_steps") == [0, 0]

        # A killed process: the error names the role and the dead rank.
        pids = group.run("pid")
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        with pytest.raises(WorkerDiedError, match=r"^policy worker rank 1 died: ") as info:
            while time.monotonic() < deadline:  # until Ray notices the death
                group.run("global_steps")
                time.sleep(0.2)
        assert info.value.__cause__ is None  # one short error, not Ray's chained traceback
    finally:
        group.shutdown()
