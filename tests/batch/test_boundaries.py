import pytest

from skyrl.batch import (
    compute_prompt_boundaries,
    compute_prompt_mini_batch_boundaries,
    optimizer_steps_per_batch,
)


def step_wise_uids(turns_per_prompt: list[list[int]]) -> list[str]:
    """One row per turn of each sample, all sharing the prompt's uid."""
    return [
        f"p{p}" for p, samples in enumerate(turns_per_prompt) for t in samples for _ in range(t)
    ]


def test_prompt_boundaries():
    assert compute_prompt_boundaries([]) == []
    assert compute_prompt_boundaries(["a"]) == [(0, 1)]
    assert compute_prompt_boundaries(["a", "a", "b", "c", "c", "c"]) == [(0, 2), (2, 3), (3, 6)]


def test_non_contiguous_uid_raises_with_uid_and_index():
    with pytest.raises(ValueError, match=r"'a' re-appears at index 3"):
        compute_prompt_boundaries(["a", "a", "b", "a"])


def test_uniform_golden():
    uids = [f"p{i // 4}" for i in range(32)]  # 8 prompts x 4 samples
    got = compute_prompt_mini_batch_boundaries(uids, mini_batch_size=2, train_batch_size=8)
    assert got == [(0, 8), (8, 16), (16, 24), (24, 32)]
    # backward compatible with fixed-size slicing [i*n*m, (i+1)*n*m)
    assert got == [(i * 4 * 2, (i + 1) * 4 * 2) for i in range(4)]
    assert compute_prompt_mini_batch_boundaries(uids, 8, 8, n_samples_per_prompt=4) == [(0, 32)]


def test_step_wise_golden():
    # turns per sample, 2 samples per prompt: rows per prompt 5, 5, 3, 2
    uids = step_wise_uids([[3, 2], [1, 4], [2, 1], [1, 1]])
    assert len(uids) == 15
    got = compute_prompt_mini_batch_boundaries(uids, 2, 4, step_wise=True, n_samples_per_prompt=2)
    assert got == [(0, 10), (10, 15)]
    assert compute_prompt_mini_batch_boundaries(uids, 1, 4, step_wise=True) == [
        (0, 5),
        (5, 10),
        (10, 13),
        (13, 15),
    ]


def test_step_wise_data_without_step_wise_flag_is_rejected():
    uids = step_wise_uids([[3, 2], [1, 4], [2, 1], [1, 1]])
    with pytest.raises(ValueError, match="fixed-size slices"):
        compute_prompt_mini_batch_boundaries(uids, 2, 4, n_samples_per_prompt=2)


def test_errors():
    uids = [f"p{i // 2}" for i in range(8)]  # 4 prompts
    with pytest.raises(ValueError, match="4 distinct prompts.*train_batch_size = 8"):
        compute_prompt_mini_batch_boundaries(uids, 2, 8)
    with pytest.raises(ValueError, match="multiple of mini_batch_size"):
        compute_prompt_mini_batch_boundaries(uids, 3, 4)
    with pytest.raises(ValueError, match="re-appears"):
        compute_prompt_mini_batch_boundaries(["a", "b", "a", "c"], 1, 3, step_wise=True)


@pytest.mark.parametrize("seed", range(5))
def test_optimizer_steps_independent_of_turns(seed):
    import random

    rng = random.Random(seed)
    train_batch_size, mini_batch_size, epochs, n = 8, 2, 3, 2
    turns = [[rng.randint(1, 5) for _ in range(n)] for _ in range(train_batch_size)]
    bounds = compute_prompt_mini_batch_boundaries(
        step_wise_uids(turns), mini_batch_size, train_batch_size, step_wise=True
    )
    # every mini-batch holds exactly mini_batch_size prompts, whatever the turns
    assert len(bounds) * epochs == optimizer_steps_per_batch(
        train_batch_size, mini_batch_size, epochs
    )
    assert optimizer_steps_per_batch(train_batch_size, mini_batch_size, epochs) == 12  # 8/2*3
    assert bounds[0][0] == 0 and bounds[-1][1] == sum(map(sum, turns))
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))


def test_one_prompt_holding_every_row_is_one_mini_batch():
    # train_batch_size 1: 3 samples of 4, 1 and 2 turns = 7 rows, all of prompt p0
    uids = step_wise_uids([[4, 1, 2]])
    assert compute_prompt_mini_batch_boundaries(uids, 1, 1, step_wise=True) == [(0, 7)]
    assert optimizer_steps_per_batch(1, 1, 2) == 2  # 1 / 1 x 2 epochs


@pytest.mark.parametrize("seed", range(5))
def test_every_mini_batch_holds_all_rows_of_exactly_its_prompts(seed):
    """Samples of one prompt with different turn counts: each mini-batch's uids are exactly
    ``mini_batch_size`` prompts, none of which has a row in another mini-batch."""
    import random

    rng = random.Random(seed)
    turns = [[rng.randint(1, 4) for _ in range(3)] for _ in range(6)]
    uids = step_wise_uids(turns)
    bounds = compute_prompt_mini_batch_boundaries(uids, 2, 6, step_wise=True)
    groups = [set(uids[a:b]) for a, b in bounds]
    assert [len(g) for g in groups] == [2, 2, 2]  # 6 prompts / 2 per mini-batch
    assert set.union(*groups) == {f"p{i}" for i in range(6)}
    for (a, b), group in zip(bounds, groups, strict=True):
        assert b - a == sum(sum(turns[int(uid[1:])]) for uid in group)
