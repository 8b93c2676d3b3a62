"""A reasoning-gym prompt file row naming a dataset that is not registered is refused at load,
naming the file and row; it passed the pre-flight and failed every step of that row."""

from __future__ import annotations

import pytest

from skyrl.envs.reasoning_gym_env import ReasoningGymEnv

ENTRY = {"question": "1 + 5 =", "answer": "6", "metadata": {"source_dataset": "chain_sum"}}


def test_init_refuses_a_row_whose_dataset_is_not_registered():
    env = ReasoningGymEnv()
    with pytest.raises(ValueError, match="Dataset 'chain_summ' not registered"):
        env.init("1 + 5 =", {"entry": ENTRY, "dataset": "chain_summ"})


def test_init_refuses_a_row_without_a_dataset_when_the_env_names_none():
    with pytest.raises(ValueError, match=r"no extras\['dataset'\] and no environment.dataset"):
        ReasoningGymEnv().init("1 + 5 =", {"entry": ENTRY})


def test_a_row_with_a_registered_dataset_opens_and_scores():
    env = ReasoningGymEnv()
    messages, _ = env.init("1 + 5 =", {"entry": ENTRY, "dataset": "chain_sum"})
    assert messages == [{"role": "user", "content": "1 + 5 ="}]
    assert env.step("<answer>6</answer>").reward == 1.0
    # environment.dataset covers rows that name none
    assert ReasoningGymEnv(dataset="chain_sum").init("1 + 5 =", {"entry": ENTRY})[0] == messages
