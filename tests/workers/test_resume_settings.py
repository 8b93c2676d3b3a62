"""A resumed run trains with the AdamW settings of its config, not those saved in the checkpoint.

DeepSpeed's ``load_checkpoint`` restores torch's optimizer and LambdaLR state dicts, and with
them the saved lr, betas, eps and weight decay: a run resumed with ``trainer.policy_optimizer.lr``
changed trained on at the old lr, while its ``config.yaml`` named the new one."""

from __future__ import annotations

import pytest
from worker_helpers import LENGTHS, LR, make_batch, make_config, one_mini_batch_chunks

from skyrl.workers.group import WorkerGroup

pytestmark = pytest.mark.slow


def one_step(group: WorkerGroup, batch):
    return group.train_mini_batch(one_mini_batch_chunks(batch))


def test_a_resume_applies_the_configs_optimizer_settings(ray_cluster, tiny_model_path, tmp_path):
    batch = make_batch(tiny_model_path, ["a", "a", "b", "b"], LENGTHS)
    saved = WorkerGroup("policy", make_config(tiny_model_path), total_optimizer_steps=10)
    try:
        assert one_step(saved, batch).lr == LR  # constant schedule, no warm-up
        saved.run("save_checkpoint", str(tmp_path))
    finally:
        saved.shutdown()
    changed = {
        "policy_optimizer.lr": LR / 10,
        "policy_optimizer.lr_warmup_steps": 4,
        "policy_optimizer.weight_decay": 0.1,
        "policy_optimizer.betas": "[0.5,0.6]",
    }
    resumed = WorkerGroup(
        "policy", make_config(tiny_model_path, **changed), total_optimizer_steps=10
    )
    try:
        reports = resumed.run("load_checkpoint", str(tmp_path))
        # make_config's eps (1.0) is the saved one too: not reported
        assert reports[0] == {
            "trainer.policy_optimizer.lr": (LR, LR / 10),
            "trainer.policy_optimizer.betas": ([0.9, 0.999], [0.5, 0.6]),
            "trainer.policy_optimizer.weight_decay": (0.0, 0.1),
        }
        assert reports[1] == reports[0]
        settings = resumed.run("optimizer_settings")[0]
        assert settings == {"betas": [0.5, 0.6], "eps": 1.0, "weight_decay": 0.1}
        # one optimizer step was taken before the save; warm-up 4 steps: the next step is the
        # second, at (1 + 1) / 4 = 0.5 of the new peak: 0.5 x 0.005 = 0.0025
        assert one_step(resumed, batch).lr == pytest.approx(LR / 10 * 0.5, rel=1e-12)
    finally:
        resumed.shutdown()


def test_a_resume_with_the_same_settings_reports_nothing(ray_cluster, tiny_model_path, tmp_path):
    batch = make_batch(tiny_model_path, ["a", "a", "b", "b"], LENGTHS)
    group = WorkerGroup("policy", make_config(tiny_model_path), total_optimizer_steps=10)
    try:
        one_step(group, batch)
        group.run("save_checkpoint", str(tmp_path))
        assert group.run("load_checkpoint", str(tmp_path)) == [{}, {}]
        assert one_step(group, batch).lr == LR
    finally:
        group.shutdown()
