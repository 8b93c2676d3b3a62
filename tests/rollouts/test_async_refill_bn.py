"""The asynchronous source's batches hold one group per prompt, as the synchronous source's
steps do (``PromptLoader.draw(refill=True)``): the dynamic filter drops groups and the
groups after them move up, so past an epoch's end a batch used to take the next shuffle's
group of a prompt it already held. Such a group now waits in line and heads the next batch.

The training set is the smoke experiment's 8 prompts; with ``trainer.seed=0`` the loader's
epochs are (``tests/rollouts/test_dynamic_rounds_bk.py`` writes them out too)
E0 = 4 1 5 2 0 3 7 6 and E1 = 3 6 1 5 7 0 4 2."""

from __future__ import annotations

import warnings

import pytest
from async_helpers import EchoEngine, async_cfg, next_batch_within, tokenizer_of

from skyrl.rollouts.async_rollouts import AsyncRollouts, Group

E0 = [4, 1, 5, 2, 0, 3, 7, 6]
E1 = [3, 6, 1, 5, 7, 0, 4, 2]


def _source(tmp_path) -> AsyncRollouts:
    """8 prompts, batches of 4, filter mode with 3 rounds' worth of drops, staleness 1."""
    cfg = async_cfg(
        "trainer.max_staleness=1", "trainer.seed=0", "trainer.train_batch_size=4",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=3",
    )  # fmt: skip
    tok = tokenizer_of(cfg)
    return AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)


def _group(source: AsyncRollouts, index: int, order: int, done: bool = True) -> Group:
    group = Group(index, source.loader.row(index, f"u{order}"), seed=0, order=order)
    group.done = done  # no trajectories: never stale
    return group


def test_the_written_out_orders_are_the_loaders(tmp_path):
    source = _source(tmp_path)
    try:
        assert [source.loader._shuffled(e) for e in (0, 1)] == [E0, E1]
    finally:
        source.close()


def test_a_batch_skips_a_second_group_of_its_prompt_which_heads_the_next(tmp_path):
    # The line after the filter dropped groups: prompt 1 of E0 (kept), then E1's 6 1 5 7 0.
    # Before: the first 4 groups, prompts 1 6 1 5 (prompt 1 twice). Now 1 6 5 7; E1's group
    # of prompt 1 stays first in line (the next batch's first), then 0.
    source = _source(tmp_path)
    try:
        line = [_group(source, i, k) for k, i in enumerate([1, 6, 1, 5, 7, 0])]
        source.line.extend(line)
        batch = source._pop_ready(1)
        assert batch is not None
        assert [g.index for g in batch] == [1, 6, 5, 7]
        assert list(source.line) == [line[2], line[5]]
        # a checkpoint now generates it again first, as the uninterrupted run trains it next
        assert [p["uid"] for p in source.state_dict()["pending"]] == ["u2", "u5"]
        # the skipped group need not be done: it is not in this batch either way
        source.line.clear()
        line[2].done = False
        source.line.extend(line)
        assert [g.index for g in source._pop_ready(1) or []] == [1, 6, 5, 7]
        assert list(source.line) == [line[2], line[5]]
    finally:
        source.close()


def test_a_batch_is_cut_only_once_its_prompts_are_done(tmp_path):
    source = _source(tmp_path)
    try:
        source.line.extend(
            [_group(source, 1, 0), _group(source, 6, 1), _group(source, 1, 2),
             _group(source, 5, 3), _group(source, 7, 4, done=False)]
        )  # fmt: skip
        assert source._pop_ready(1) is None  # 7 may still be dropped
        assert [g.index for g in source.line] == [1, 6, 1, 5, 7]
    finally:
        source.close()


def test_the_stream_never_trains_two_groups_of_a_prompt_in_one_batch(tmp_path):
    # The filter keeps prompt 1 only; a batch may drop (3 - 1) x 4 = 8 groups. Admission
    # order: E0 (chunks 1, 2: uids s1r0p0-3, s2r0p4-7), then E1 (chunk 3: s3r0p8-15).
    # E0: 1 kept, its 7 others dropped; the 8th drop is E1's first group, 3 (drops go in
    # admission order); the rest are kept flat. Before, batch 1 was
    # 1 6 1 5 (or 1 3 6 1): E1's group of prompt 1 (E1[2], uid s3r0p10) joined E0's.
    source = _source(tmp_path)
    index_of: dict[str, int] = {}
    draw = source.loader.draw

    def recorded(prefix: str, refill: bool = False) -> list[tuple[int, str]]:
        drawn = draw(prefix, refill)
        index_of.update((uid, i) for i, uid in drawn)
        return drawn

    source.loader.draw = recorded  # type: ignore[method-assign]
    source.keep = lambda out: index_of[out.uids[0]] == 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the flat groups kept
            first, _ = next_batch_within(source, 1)
            uids = list(dict.fromkeys(first.metadata["uids"]))
            assert len(uids) == 4
            assert "s1r0p1" in uids  # E0[1] = prompt 1 (after E0[0] = 4, when that was dropped)
            assert "s3r0p10" not in uids  # E1[2] = prompt 1 again
            assert len({index_of[u] for u in uids}) == 4
            with source.updating_weights(1, timeout_s=10):
                pass
            second, _ = next_batch_within(source, 2)
        uids = list(dict.fromkeys(second.metadata["uids"]))
        # E1's group of prompt 1, skipped by batch 1, heads batch 2
        assert "s3r0p10" in uids
        assert len({index_of[u] for u in uids}) == 4
    finally:
        source.close()


def test_a_full_line_of_fewer_prompts_than_a_batch_is_cut_as_it_stands_with_a_warning(tmp_path):
    # Staleness 1, batches of 4: at most (1 + 1) x 4 = 8 groups in line. 8 groups, all done,
    # of prompts 1 and 6 only: no other group can come, so the batch is the first 4 as they
    # stand, 1 6 1 6 (4 groups - 2 prompts = 2 repeats), rather than a stream that hangs.
    source = _source(tmp_path)
    try:
        line = [_group(source, i, k) for k, i in enumerate([1, 6] * 4)]
        source.line.extend(line)
        source.admission.in_line = 7
        assert source._pop_ready(1) is None  # one more group may come
        source.admission.in_line = 8
        with pytest.warns(UserWarning) as caught:
            batch = source._pop_ready(1)
        assert batch == line[:4]
        assert [str(w.message) for w in caught] == [
            "step 1: dynamic sampling: a batch holds 2 repeated prompt(s): the groups in line "
            "(8, as many as trainer.max_staleness allows) hold fewer than "
            "trainer.train_batch_size=4 prompts"
        ]
    finally:
        source.close()
