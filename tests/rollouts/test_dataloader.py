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


def _saved_after_two_batches(rows: list[PromptRow], seed: int = 5) -> dict:
    loader = PromptLoader(rows, batch_size=2, seed=seed)
    loader.next_batch("s")
    loader.next_batch("s")
    return loader.state_dict()


def test_resuming_over_other_prompts_or_seed_warns_in_one_line(capsys):
    # The order is a shuffle of the row indices seeded by trainer.seed: over other rows (or
    # another seed) the rest of the epoch comes from another order, some prompts again and
    # some never. It stays allowed (a curriculum changes its prompts on purpose), with a line.
    saved = _saved_after_two_batches(_rows(7))
    cases = [
        (_rows(9), 5, "7 prompts (seed 5); this run has 9 prompts (seed 5)"),
        (_rows(7), 6, "7 prompts (seed 5); this run has 7 prompts (seed 6)"),
        # same count and seed, other text: row 3 rephrased
        ([*_rows(3), PromptRow("q3 rephrased", "src"), *_rows(7)[4:]], 5, "other prompts"),
    ]
    for rows, seed, said in cases:
        PromptLoader(rows, batch_size=2, seed=seed).load_state_dict(saved)
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("warning: trainer.resume: the checkpoint's prompt order was drawn")
        assert said in line and "prompts may repeat or be skipped until epoch 1 ends" in line


def test_resuming_over_the_same_prompts_says_nothing(capsys):
    saved = _saved_after_two_batches(_rows(7))
    PromptLoader(_rows(7), batch_size=2, seed=5).load_state_dict(saved)
    legacy = {k: saved[k] for k in ("epoch", "cursor", "drawn")}  # saved before the record
    PromptLoader(_rows(9), batch_size=2, seed=5).load_state_dict(legacy)
    assert capsys.readouterr().err == ""


def test_resuming_at_the_end_of_an_epoch_over_other_prompts_says_nothing(capsys):
    # 8 rows, batches of 2: after 4 batches the epoch is used up (cursor 8), so the next
    # draw starts epoch 1 whatever the prompts; nothing of epoch 0 is left to repeat or skip.
    # A curriculum stage resumed over the next stage's prompts is this case; it used to say
    # "prompts may repeat or be skipped until epoch 1 ends".
    saved_loader = PromptLoader(_rows(8), batch_size=2, seed=5)
    for _ in range(4):
        saved_loader.next_batch("s")
    saved = saved_loader.state_dict()
    other = [PromptRow(f"stage2 q{i}", "src") for i in range(8)]
    resumed = PromptLoader(other, batch_size=2, seed=5)
    resumed.load_state_dict(saved)
    assert capsys.readouterr().err == ""
    resumed.next_batch("s")
    assert (resumed.epoch, resumed.cursor) == (1, 2)
    # 9 prompts: 8 + 2 > 9, a new epoch too; 10 prompts: 8 + 2 <= 10, epoch 0 goes on over
    # another order (prompts 8 and 9 of a new shuffle of 10): that one warns
    PromptLoader(_rows(9), batch_size=2, seed=5).load_state_dict(saved)
    assert capsys.readouterr().err == ""
    PromptLoader(_rows(10), batch_size=2, seed=5).load_state_dict(saved)
    (line,) = capsys.readouterr().err.splitlines()
    assert "8 prompts (seed 5); this run has 10 prompts (seed 5)" in line
