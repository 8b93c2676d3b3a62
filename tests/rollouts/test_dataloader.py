"""The prompt loader: seeded epochs, independent copies, resumable state."""

from __future__ import annotations

import pytest

from skyrl.data import PromptRow
from skyrl.rollouts.dataloader import PromptLoader


def _rows(n: int) -> list[PromptRow]:
    return [PromptRow(f"q{i}", "src", {"answer": i, "seen": []}) for i in range(n)]


def test_epochs_cover_every_row_once_and_drop_the_remainder():
    loader = PromptLoader(_rows(10), batch_size=3, seed=0)
    assert loader.batches_per_epoch == 3
    epoch0 = [r.prompt for _ in range(3) for r in loader.next_batch("s")]
    assert len(set(epoch0)) == 9  # 3 batches of 3 distinct rows; one row left over
    nxt = loader.next_batch("s")
    assert loader.epoch == 1 and len(nxt) == 3


def test_rows_are_independent_copies_with_unique_uids():
    rows = _rows(4)
    loader = PromptLoader(rows, batch_size=4, seed=0)
    batch = loader.next_batch("s1")
    batch[0].extras["seen"].append("mutated")
    assert all(r.extras["seen"] == [] for r in rows)  # the dataset is untouched
    again = loader.next_batch("s2")  # next epoch, same rows
    assert all(r.extras["seen"] == [] for r in again)
    uids = [r.uid for r in batch + again]
    assert len(set(uids)) == 8


def test_state_round_trip_reproduces_the_next_batches():
    a = PromptLoader(_rows(7), batch_size=2, seed=5)
    for _ in range(4):  # into the second epoch
        a.next_batch("s")
    b = PromptLoader(_rows(7), batch_size=2, seed=5)
    b.load_state_dict(a.state_dict())
    for _ in range(5):
        assert [(r.prompt, r.uid) for r in a.next_batch("t")] == [
            (r.prompt, r.uid) for r in b.next_batch("t")
        ]


def test_too_few_rows_for_one_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="3 prompts, fewer than trainer.train_batch_size=4"):
        PromptLoader(_rows(3), batch_size=4, seed=0)
