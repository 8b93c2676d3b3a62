"""Prompt-unit sizes: bad sizes are one ``ValueError`` naming both, never a wrong count."""

import pytest

from skyrl.batch import compute_prompt_mini_batch_boundaries, optimizer_steps_per_batch

NOT_A_MULTIPLE = r"train_batch_size \({}\) must be a positive multiple of mini_batch_size \({}\)"


@pytest.mark.parametrize(
    ("train_batch_size", "mini_batch_size"),
    [(8, 0), (8, -2), (8, 3), (0, 4), (-8, 4)],
)
def test_optimizer_steps_refuse_sizes_that_are_not_a_positive_multiple(
    train_batch_size, mini_batch_size
):
    # before: (8, 0) ZeroDivisionError, (8, -2) returned -4 steps, (0, 4) 0 steps,
    # (-8, 4) -2 steps, (8, 3) "8 is not a multiple of 3" naming neither argument
    with pytest.raises(ValueError, match=NOT_A_MULTIPLE.format(train_batch_size, mini_batch_size)):
        optimizer_steps_per_batch(train_batch_size, mini_batch_size)


@pytest.mark.parametrize("epochs", [0, -1])
def test_optimizer_steps_refuse_update_epochs_below_one(epochs):
    with pytest.raises(ValueError, match=f"update_epochs_per_batch must be >= 1, got {epochs}"):
        optimizer_steps_per_batch(8, 2, epochs)


def test_optimizer_steps_golden():
    assert optimizer_steps_per_batch(8, 2, 3) == 12  # 8 / 2 * 3


def test_boundaries_refuse_an_empty_batch_of_train_batch_size_zero():
    # before: ZeroDivisionError from len(uids) // train_batch_size
    with pytest.raises(ValueError, match=NOT_A_MULTIPLE.format(0, 1)):
        compute_prompt_mini_batch_boundaries([], mini_batch_size=1, train_batch_size=0)
