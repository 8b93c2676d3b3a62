"""Each trained role's LR schedule spans the optimizer steps it takes (skyrl/trainer/plan.py)."""

from __future__ import annotations

from hydra import compose, initialize_config_module

from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.trainer.plan import format_plan, make_plan, optimizer_steps


def _config(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


def test_critic_and_policy_each_get_their_own_count():
    # 20 steps of 16 prompts; the policy takes 16/8 = 2 mini-batches a step and waits the
    # first 3 steps: (20 - 3) x 2 = 34; the critic takes 16/4 = 4 every step: 20 x 4 = 80.
    # (Both were given 20 x 2 = 40: the critic's cosine reached its floor halfway through the
    # run, the policy's never finished.)
    cfg = _config(
        "experiment=ppo_critic",
        "trainer.train_batch_size=16",
        "trainer.policy_mini_batch_size=8",
        "trainer.critic_mini_batch_size=4",
        "trainer.critic_only_steps=3",
        "trainer.update_epochs_per_batch=1",
    )
    plan = make_plan(cfg)
    assert (plan.optimizer_steps_per_step, plan.critic_optimizer_steps_per_step) == (2, 4)
    assert optimizer_steps(cfg, plan, total_steps=20) == {"policy": 34, "critic": 80}
    assert "optimizer steps / step  2 (critic 4)" in format_plan(plan)


def test_epochs_multiply_and_no_critic_means_no_critic_count():
    # 2 mini-batches x 3 epochs = 6 a step, over 5 steps = 30
    cfg = _config(
        "trainer.train_batch_size=8",
        "trainer.policy_mini_batch_size=4",
        "trainer.update_epochs_per_batch=3",
    )
    plan = make_plan(cfg)
    assert plan.critic_optimizer_steps_per_step == 0
    assert optimizer_steps(cfg, plan, total_steps=5) == {"policy": 30}
    assert "optimizer steps / step  6\n" in format_plan(plan)


def test_more_critic_only_steps_than_steps_leaves_the_policy_none():
    # a file source's length is known only at run time: ppo_critic waits 3 steps of 2
    cfg = _config("experiment=ppo_critic")
    assert optimizer_steps(cfg, make_plan(cfg), total_steps=2)["policy"] == 0


def test_dropped_prompts_leave_the_step_count_to_the_loader():
    """A generated source with data.overlong_prompts=drop: the count of prompts left is known
    only once they load, so the plan leaves the total to the loader (epochs x batches of the
    kept prompts). It said epochs x num_train_prompts / train_batch_size: 16 steps of 64
    prompts where 51 were kept, so epochs=1 ran 4 steps into a second epoch."""
    from skyrl.config.validate import known_total_steps

    base = ["data.num_train_prompts=64", "trainer.train_batch_size=4", "trainer.total_steps=null"]
    assert known_total_steps(_config(*base)) == 16
    dropping = _config(*base, "data.overlong_prompts=drop")
    assert known_total_steps(dropping) is None and make_plan(dropping).total_steps is None
    fixed = _config(*base, "data.overlong_prompts=drop", "trainer.total_steps=7")
    assert known_total_steps(fixed) == 7
