"""A learning-rate warm-up longer than the role's whole schedule is flagged in the plan: the
learning rate would never reach ``lr`` (``lr_lambda`` multiplies it by (step + 1) / warm-up)."""

from __future__ import annotations

from hydra import compose, initialize_config_module

from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.trainer.plan import format_plan, make_plan, short_warm_ups
from skyrl.workers.deepspeed_setup import lr_lambda


def _config(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


# the smoke experiment (lr 1e-4) with 4 steps of 2 policy mini-batches: 4 x 2 = 8 policy optimizer steps
SMOKE = ["experiment=smoke", "trainer.total_steps=4", "trainer.train_batch_size=4",
         "trainer.policy_mini_batch_size=2"]  # fmt: skip


def test_a_warm_up_past_the_last_optimizer_step_is_a_plan_warning():
    cfg = _config(*SMOKE, "trainer.policy_optimizer.lr_warmup_steps=10")
    plan = make_plan(cfg)
    assert plan.optimizer_steps_per_step == 2
    # the 8th (last) step runs at (7 + 1) / 10 = 80% of lr
    line = (
        "trainer.policy_optimizer.lr_warmup_steps=10 outlasts the run's 8 policy optimizer "
        "steps: the learning rate never reaches lr=0.0001 (its last step runs at 80% of it)"
    )
    assert plan.warm_ups == (line,)
    assert f"  warning                 {line}" in format_plan(plan).splitlines()
    assert lr_lambda(cfg.trainer.policy_optimizer, 8)(7) == 0.8


def test_a_warm_up_that_ends_on_the_last_step_is_not_flagged():
    cfg = _config(*SMOKE, "trainer.policy_optimizer.lr_warmup_steps=8")
    assert make_plan(cfg).warm_ups == ()
    assert lr_lambda(cfg.trainer.policy_optimizer, 8)(7) == 1.0  # (7 + 1) / 8


def test_the_critic_schedule_is_checked_on_its_own_length():
    # gae: a critic; its mini-batch of 4 prompts is 4 // 4 = 1 optimizer step per step, 4 in all;
    # the policy's 8 steps clear its warm-up of 6
    cfg = _config(
        *SMOKE,
        "algorithm=ppo",
        "trainer.critic_mini_batch_size=4",
        "trainer.policy_optimizer.lr_warmup_steps=6",
        "trainer.critic_optimizer.lr_warmup_steps=6",
    )
    plan = make_plan(cfg)
    assert plan.critic_optimizer_steps_per_step == 1
    assert plan.warm_ups == (
        "trainer.critic_optimizer.lr_warmup_steps=6 outlasts the run's 4 critic optimizer "
        "steps: the learning rate never reaches lr=5e-06 (its last step runs at 67% of it)",
    )


def test_a_total_known_only_from_the_data_is_checked_by_the_trainer():
    """With prompt files the plan cannot count steps; the trainer calls ``short_warm_ups``
    with the total it derives from the loaded prompts."""
    cfg = _config(*SMOKE, "trainer.policy_optimizer.lr_warmup_steps=10")
    plan = make_plan(cfg)
    assert (
        short_warm_ups(cfg, plan, 5) == []
    )  # 5 x 2 = 10 optimizer steps: warm-up ends on the last
    # 3 x 2 = 6 steps: the last runs at (5 + 1) / 10 = 60% of lr
    assert short_warm_ups(cfg, plan, 3) == [
        "trainer.policy_optimizer.lr_warmup_steps=10 outlasts the run's 6 policy optimizer "
        "steps: the learning rate never reaches lr=0.0001 (its last step runs at 60% of it)"
    ]
