"""``FakeRollouts``' rollout metrics mean what the generator's mean: ``generate/reward_mean``
is over trajectories (their last rows), not over rows."""

from __future__ import annotations

from transformers import AutoTokenizer

import skyrl
from skyrl.config.validate import validate
from skyrl.models.resolve import with_local_model_paths
from skyrl.rollouts.fake import FakeRollouts
from skyrl.tracking import metric_names as names


def test_step_wise_fake_reward_mean_is_over_trajectories_not_rows():
    # Step-wise fake rows carry the trajectory's reward on its last row and 0 on the others,
    # so a mean over rows counted every earlier turn as a reward of 0.
    cfg = with_local_model_paths(
        validate(
            skyrl.compose(
                ["experiment=smoke", "data=fake", "generator.step_wise=true",
                 "generator.max_turns=3"]
            )
        )
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)
    batch, metrics = FakeRollouts(cfg, tok).next_batch(1)
    rewards = batch.require("rewards").tolist()
    last = batch.metadata["is_last_step"]
    # step 1 of the default data.seed: 2 prompts x 2 samples = 4 trajectories in 5 rows (one has two
    # turns); last-row rewards 1, 1, 1, 0 -> 3 / 4 = 0.75 (over the 5 rows: 3 / 5 = 0.6)
    assert (len(rewards), sum(last)) == (5, 4)
    assert sorted(r for r, is_last in zip(rewards, last, strict=True) if is_last) == [0, 1, 1, 1]
    assert metrics[names.REWARD] == 0.75
