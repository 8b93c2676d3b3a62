"""A resumed ``AsyncRollouts`` keeps what the dynamic filter had dropped for the next batch
before the checkpoint: its allowance is not granted twice (docs/async.md: a batch drops at
most ``(max_sample_batches - 1) * train_batch_size`` groups, and a resumed run trains on the
prompts of the uninterrupted one)."""

from __future__ import annotations

import time
import warnings

from async_helpers import TimedEngine, async_cfg, next_batch_within, tokenizer_of
from test_async_stream import AlwaysRight

from skyrl.rollouts.async_rollouts import AsyncRollouts
from skyrl.tracking import metric_names as names


def flat_filter_cfg():
    """Batches of 2 at staleness 1, every group flat, the filter on with
    max_sample_batches 2: each batch may drop 2 groups."""
    return async_cfg(
        "trainer.max_staleness=1", f"environment._target_={AlwaysRight.__module__}.AlwaysRight",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=2",
    )  # fmt: skip


def _uids(batch) -> list[str]:
    return sorted(set(batch.metadata["uids"]))


def _wait_for_full_line(source, timeout_s: float = 20.0) -> None:
    """Until the line holds (k + 1) x batch = 4 groups, all generated (the next batch's two
    drops made): stand-in for the time a checkpoint is written after a step's sync."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = list(source.line)
        except RuntimeError:  # the source's loop changed the line meanwhile
            continue
        if len(line) == 4 and all(g.done for g in line):
            return
        time.sleep(0.01)
    raise AssertionError("the line did not fill")


def test_a_resumed_stream_does_not_drop_the_next_batchs_groups_twice():
    # Batch 2, max_sample_batches 2: a batch may drop (2 - 1) x 2 = 2 rejected groups, and
    # every group is flat. Step 1 trains s2r0p2 s2r0p3 (p0 p1 dropped); after its sync batch
    # 2's stretch drops p4 p5 (its 2) and keeps p6 p7 flat. A checkpoint then holds p6..p9.
    # Resumed, batch 2 had its whole allowance again: it dropped p6 p7 too (4 drops for one
    # batch) and trained s5r0p8 s5r0p9, where the uninterrupted run trains s4r0p6 s4r0p7.
    cfg = flat_filter_cfg()
    tok = tokenizer_of(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the flat top-up warnings
        straight = AsyncRollouts(cfg, TimedEngine(tok, {}), tok)
        try:
            assert _uids(next_batch_within(straight, 1)[0]) == ["s2r0p2", "s2r0p3"]
            with straight.updating_weights(1, timeout_s=10):
                pass
            _wait_for_full_line(straight)
            state = straight.state_dict()
            batch, metrics = next_batch_within(straight, 2)
        finally:
            straight.close()
        assert [p["uid"] for p in state["pending"]] == ["s4r0p6", "s4r0p7", "s5r0p8", "s5r0p9"]
        assert _uids(batch) == ["s4r0p6", "s4r0p7"]
        assert metrics[names.ASYNC_FILTERED_GROUPS] == 2  # p4 p5

        resumed = AsyncRollouts(cfg, TimedEngine(tok, {}), tok)
        try:
            resumed.load_state_dict(state)
            batch, metrics = next_batch_within(resumed, 2)
        finally:
            resumed.close()
    assert _uids(batch) == ["s4r0p6", "s4r0p7"]
    assert metrics[names.ASYNC_FILTERED_GROUPS] == 2  # the drops before the checkpoint
    assert metrics[names.KEPT_GROUP_FRAC] == 0.0  # 2 flat kept of 2 + 2 dropped: 0 / 4
