"""Worker failures surface as one error naming the role and the rank, not a raw Ray error."""

from __future__ import annotations

import os
import signal
import time

import pytest
from hydra import compose, initialize_config_module

from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.workers.group import WorkerDiedError, WorkerGroup

pytestmark = pytest.mark.slow


def make_config(model_path: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"model.path={model_path}", "generator.n_samples_per_prompt=2",
                "generator.max_prompt_length=4", "generator.max_generate_length=12",
                "trainer.dp_size=2", "trainer.train_batch_size=2",
                "trainer.policy_mini_batch_size=2", "trainer.collective_timeout_min=1",
            ],
        )  # fmt: skip
    return validate(cfg)


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
