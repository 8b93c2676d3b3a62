"""A worker group that fails surfaces as one line naming what failed: the role, the rank and
the cause of a step that failed on one rank (not a peer's lost collective), the keys of
workers that do not fit."""

from __future__ import annotations

import os
import signal
import time

import pytest
from worker_helpers import LENGTHS, make_batch, make_config, one_mini_batch_chunks

import skyrl.workers.group as group_module
from skyrl.workers.group import WorkerDiedError, WorkerGroup

pytestmark = pytest.mark.slow


def _chunks(model_path: str) -> list:
    """One mini-batch of 2 prompts x 2 samples, staged for 2 ranks."""
    return one_mini_batch_chunks(make_batch(model_path, ["a", "a", "b", "b"], LENGTHS))


def test_a_rank_raising_mid_step_is_one_line_naming_role_rank_and_cause(
    ray_cluster, tiny_model_path
):
    """Rank 1 raises in its first micro batch's loss (a bad batch) while rank 0 goes on into
    the step's collectives, where it stays blocked (until ``collective_timeout_min``): the
    error names rank 1 and its cause, at once. It named no rank, after 30 s of waiting on
    rank 0 (30 s more for each blocked rank)."""

    def break_loss(worker):  # nested: Ray pickles it by value into the actor
        def bad_batch(*_args, **_kwargs):
            raise ValueError("advantages has 3 columns, loss_mask 16")

        worker._micro_batch_loss = bad_batch

    group = WorkerGroup("policy", make_config(tiny_model_path), total_optimizer_steps=1)
    try:
        chunks = _chunks(tiny_model_path)
        group.get([group.actors[1].__ray_call__.remote(break_loss)])
        started = time.monotonic()
        with pytest.raises(RuntimeError) as info:
            group.train_mini_batch(chunks)
        waited_s = time.monotonic() - started
        assert str(info.value) == (
            "policy worker rank 1 failed: ValueError: advantages has 3 columns, loss_mask 16"
        )
        assert waited_s < 30, f"waited {waited_s:.0f} s for the other rank's collectives"
    finally:
        group.shutdown()


def test_a_rank_killed_mid_step_is_named_not_its_peers_lost_collective(
    ray_cluster, tiny_model_path
):
    """Rank 1's process ends inside its step (OOM-killed, say) while rank 0 goes on into the
    step's collectives, where gloo then fails ("Connection closed by peer"): the error is the
    dead rank's, in one line."""

    def die_in_the_loss(worker):  # nested: Ray pickles it by value into the actor
        def killed(*_args, **_kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        worker._micro_batch_loss = killed

    group = WorkerGroup("policy", make_config(tiny_model_path), total_optimizer_steps=1)
    try:
        group.get([group.actors[1].__ray_call__.remote(die_in_the_loss)])
        with pytest.raises(WorkerDiedError, match=r"^policy worker rank 1 died: ") as info:
            group.train_mini_batch(_chunks(tiny_model_path))
        assert "\n" not in str(info.value) and info.value.__cause__ is None
    finally:
        group.shutdown()


def test_workers_that_do_not_fit_are_a_config_error_naming_the_keys(
    ray_cluster, tiny_model_path, monkeypatch
):
    """2 ranks of 6 CPUs each in the tests' 8-CPU Ray (on a GPU box: 2 ranks of 1 GPU on a
    machine with 1) never get their bundles: one line naming the keys and what Ray has, after
    ``PLACEMENT_TIMEOUT_S`` (120 s; 1 s here), not Ray's GetTimeoutError; and the pending
    placement group is removed, not left to take the resources once they free up."""
    import ray

    from skyrl.config.errors import ConfigError

    monkeypatch.setattr(group_module, "PLACEMENT_TIMEOUT_S", 1.0, raising=False)
    cfg = make_config(tiny_model_path, dp_size=2, num_cpus_per_worker=6)
    before = set(ray.util.placement_group_table())
    with pytest.raises(ConfigError) as info:
        WorkerGroup("policy", cfg, total_optimizer_steps=1)
    assert str(info.value) == (
        "trainer.dp_size: 2 policy workers of 6 CPUs and 0 GPUs each "
        "(trainer.num_cpus_per_worker, trainer.num_gpus_per_worker) found no room in Ray "
        "within 1 s: it has 8 CPUs and 0 GPUs, 8 CPUs and 0 GPUs of them free"
    )
    tables = ray.util.placement_group_table()
    assert [tables[pg]["state"] for pg in set(tables) - before] == ["REMOVED"]
