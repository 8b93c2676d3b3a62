"""Ctrl-C while a worker group's ranks start (DeepSpeed's set-up takes seconds) kills the
ranks started so far and removes the group's placement group. Before, only a dead rank did:
an interrupted ``skyrl.train`` in a notebook left the bundles reserved, and the next
``skyrl.train`` in that kernel failed after 120 s ("found no room in Ray ... 1 CPUs ... of
them free")."""

from __future__ import annotations

import time

import pytest
import ray
from worker_helpers import make_config

from skyrl.workers.group import WorkerGroup


def _free_cpus() -> float:
    return ray.available_resources().get("CPU", 0.0)


def _interrupted_get(self, refs, timeout=None):
    raise KeyboardInterrupt


def test_an_interrupted_start_frees_its_bundles(ray_cluster, tiny_model_path, monkeypatch):
    cfg = make_config(tiny_model_path, dp_size=1)
    free = _free_cpus()
    monkeypatch.setattr(WorkerGroup, "get", _interrupted_get)  # Ctrl-C while ranks start
    with pytest.raises(KeyboardInterrupt):
        WorkerGroup("policy", cfg, total_optimizer_steps=1)
    deadline = time.monotonic() + 30  # removal and kills are asynchronous in Ray
    while _free_cpus() < free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _free_cpus() == free  # a leaked bundle held cfg.trainer.num_cpus_per_worker
