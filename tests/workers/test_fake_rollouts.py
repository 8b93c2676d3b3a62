"""``fake_rollouts``: generator-shaped random batches for ``data=fake``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module

from skyrl.batch import compute_prompt_boundaries
from skyrl.workers.fake_rollouts import fake_rollouts


def test_shapes_masks_and_metadata():
    batch = fake_rollouts(8, 4, vocab_size=100, prompt_len=(5, 10), max_seq_len=64, seed=1)
    n = len(batch)
    assert n == 32
    assert batch.input_ids.shape == batch.attention_mask.shape == batch.loss_mask.shape
    assert batch.input_ids.shape[1] <= 64 and batch.rewards.shape == (n,)
    assert int(batch.input_ids.max()) < 100 and int(batch.input_ids.min()) >= 0
    lengths = batch.real_lengths()
    positions = torch.arange(batch.input_ids.shape[1])
    # right-padded; loss on a non-empty response after a 5..10 token prompt
    assert torch.equal(batch.attention_mask.bool(), positions < lengths[:, None])
    prompt = lengths - batch.loss_mask.sum(1).long()
    assert bool(((prompt >= 5) & (prompt <= 10)).all()) and bool((lengths > prompt).all())
    assert torch.equal(
        batch.loss_mask.bool(), (positions >= prompt[:, None]) & (positions < lengths[:, None])
    )
    assert bool((batch.rollout_logprobs[batch.loss_mask == 0] == 0).all())
    assert bool((batch.rollout_logprobs[batch.loss_mask > 0] < 0).all())
    assert set(batch.rewards.tolist()) <= {0.0, 1.0}
    assert batch.metadata["uids"] == [f"p{i // 4}" for i in range(n)]
    assert batch.metadata["trajectory_ids"] == [f"p{i // 4}/{i % 4}" for i in range(n)]
    assert all(batch.metadata["is_last_step"])
    # samples of one prompt share its prompt tokens
    for start, end in compute_prompt_boundaries(batch.metadata["uids"]):
        p = int(prompt[start])
        assert bool((batch.input_ids[start:end, :p] == batch.input_ids[start, :p]).all())


def test_response_lengths_are_long_tailed_and_clipped():
    batch = fake_rollouts(
        64, 8, vocab_size=50, prompt_len=(4, 4), response_len_mean=40.0,
        response_len_sigma=1.0, max_seq_len=256, seed=0,
    )  # fmt: skip
    response = batch.loss_mask.sum(1).numpy()
    assert response.min() >= 1 and response.max() <= 252
    assert 30 < response.mean() < 50  # the mean is the log-normal's mean (some mass clipped)
    assert np.median(response) < response.mean()  # right-skewed
    assert response.max() > 4 * np.median(response)


def test_same_seed_same_batch_other_seed_differs():
    a, b, c = (fake_rollouts(4, 2, 64, max_seq_len=128, seed=s) for s in (3, 3, 4))
    for key in a.keys():
        assert torch.equal(a[key], b[key])
    assert a.metadata == b.metadata
    assert a.input_ids.shape != c.input_ids.shape or not torch.equal(a.input_ids, c.input_ids)


def test_step_wise_rows_are_turns_of_contiguous_trajectories():
    batch = fake_rollouts(
        6, 3, vocab_size=80, prompt_len=(3, 6), response_len_mean=8.0, max_seq_len=96,
        seed=5, step_wise=True, max_turns=4,
    )  # fmt: skip
    uids, tids = batch.metadata["uids"], batch.metadata["trajectory_ids"]
    last, rewards = batch.metadata["is_last_step"], batch.rewards.tolist()
    assert len(batch) > 18  # some trajectories have several turns
    compute_prompt_boundaries(uids)  # raises unless each uid's rows are contiguous
    runs = [i for i in range(len(tids)) if i == 0 or tids[i] != tids[i - 1]]
    assert len(runs) == len(set(tids)) == 18  # trajectories are contiguous
    for i in range(len(tids)):
        ends_here = i + 1 == len(tids) or tids[i + 1] != tids[i]
        assert last[i] == ends_here, f"row {i}"
        if not ends_here:
            assert rewards[i] == 0.0
            # the next turn's context extends this turn's prompt + response
            n = int(batch.attention_mask[i].sum())
            assert torch.equal(batch.input_ids[i + 1, :n], batch.input_ids[i, :n])
    assert max(len([t for t in tids if t == tid]) for tid in set(tids)) <= 4


def test_bad_arguments():
    with pytest.raises(ValueError, match="prompt_len"):
        fake_rollouts(1, 1, 10, prompt_len=(8, 4))
    with pytest.raises(ValueError, match="prompt_len"):
        fake_rollouts(1, 1, 10, prompt_len=(4, 64), max_seq_len=64)


def test_data_fake_composes():
    from skyrl.config import register_configs

    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose("config", overrides=["data=fake"])
    assert cfg.data.source == "fake"
