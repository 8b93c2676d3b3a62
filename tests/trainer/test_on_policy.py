"""Which configs take the old logprobs from the training forward (``skyrl.trainer.on_policy``)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.trainer.on_policy import describe, separate_forward_reason
from skyrl.trainer.plan import format_plan, make_plan

ONE_MINI_BATCH = ["trainer.train_batch_size=4", "trainer.policy_mini_batch_size=4"]
PPO_NO_KL = ["algorithm=ppo", "algorithm.use_kl_in_reward=false"]


def _config(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (ONE_MINI_BATCH, None),
        (ONE_MINI_BATCH + ["algorithm.use_kl_loss=true"], None),  # the reference is separate
        (["trainer.train_batch_size=8", "trainer.policy_mini_batch_size=4"], "2 policy mini"),
        (ONE_MINI_BATCH + ["trainer.update_epochs_per_batch=2"], "update_epochs_per_batch=2"),
        # the critic's updates leave the policy's weights alone; ppo's KL in the reward does not
        (ONE_MINI_BATCH + ["algorithm=ppo", "trainer.critic_mini_batch_size=4"], "in_reward"),
        (ONE_MINI_BATCH + [*PPO_NO_KL, "trainer.critic_mini_batch_size=4"], None),
        (ONE_MINI_BATCH + ["algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
        (ONE_MINI_BATCH + ["trainer.reuse_training_logprobs=false"], "reuse_training_logprobs"),
        # LoRA's adapter dropout is a config key: known without loading the model
        (ONE_MINI_BATCH + ["model.lora.rank=8", "model.lora.dropout=0.05"], "lora.dropout=0.05"),
        (ONE_MINI_BATCH + ["model.lora.rank=8"], None),  # dropout 0: PEFT's Identity
        (ONE_MINI_BATCH + ["model.lora.dropout=0.05"], None),  # rank 0: no adapters at all
    ],
)
def test_separate_forward_only_where_the_step_is_not_exactly_on_policy(overrides, reason):
    found = separate_forward_reason(_config(*overrides))
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found


def test_the_plan_says_where_the_old_logprobs_come_from():
    plan = format_plan(make_plan(_config(*ONE_MINI_BATCH)))
    # the plan cannot see the model's own dropout (GPT-2's layers: p=0.1), the start-up check
    # can: the plan says the skip depends on it, the start-up log says what was decided
    assert (
        "old logprobs            the training forward's own (on-policy step: no separate "
        "forward), unless the model has dropout (checked at start)"
    ) in plan
    assert (
        describe(_config(*ONE_MINI_BATCH), None)
        == "the training forward's own (on-policy step: no separate forward)"
    )
    lora = format_plan(
        make_plan(_config(*ONE_MINI_BATCH, "model.lora.rank=8", "model.lora.dropout=0.05"))
    )
    assert (
        "old logprobs            a separate forward (dropout in the policy's training forward: "
        "model.lora.dropout=0.05)"
    ) in lora
    main_job = format_plan(make_plan(_config()))  # 8 prompts in mini-batches of 4
    assert "a separate forward (2 policy mini-batches per step)" in main_job


def test_the_plan_names_the_critics_warm_up_steps_as_separate_forwards():
    # on the critic-only steps the policy does not train: no training forward to take from
    ppo = [*ONE_MINI_BATCH, *PPO_NO_KL, "trainer.critic_mini_batch_size=4"]
    for warm_up, steps in ((1, "step 1"), (3, "steps 1-3")):
        cfg = _config(*ppo, f"trainer.critic_only_steps={warm_up}", "trainer.total_steps=5")
        assert describe(cfg, separate_forward_reason(cfg)) == (
            "the training forward's own (on-policy step: no separate forward); a separate "
            f"forward on the critic-only {steps}"
        )
