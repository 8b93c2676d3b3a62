"""The dynamic filter's drops are decided in admission order, so which groups a batch holds
does not depend on which group finished first (docs/async.md: "which prompts a step sees
does not depend on timing")."""

from __future__ import annotations

import warnings

from async_helpers import TimedEngine, async_cfg, next_batch_within, tokenizer_of
from test_async_stream import AlwaysRight

from skyrl.rollouts.async_rollouts import AsyncRollouts
from skyrl.tracking import metric_names as names


def _batches(delays_s: dict[str, float]) -> list[tuple[list[str], float]]:
    """The uids and filtered-group counts of the first two batches of a stream whose groups
    are all flat, with the prompts in ``delays_s`` answered that many seconds late."""
    cfg = async_cfg(
        "trainer.max_staleness=1", f"environment._target_={AlwaysRight.__module__}.AlwaysRight",
        "algorithm.dynamic_sampling=filter", "algorithm.max_sample_batches=2",
    )  # fmt: skip
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, TimedEngine(tok, delays_s), tok)
    out = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the flat top-up warnings
            for step in (1, 2):
                batch, metrics = next_batch_within(source, step)
                out.append(
                    (sorted(set(batch.metadata["uids"])), metrics[names.ASYNC_FILTERED_GROUPS])
                )
                with source.updating_weights(step, timeout_s=10):
                    pass
    finally:
        source.close()
    return out


def test_the_filter_drops_the_first_rejected_groups_in_admission_order_whatever_finishes_first():
    # Batches of 2, max_sample_batches 2: each batch may drop (2 - 1) x 2 = 2 rejected groups,
    # and every group is flat (every reply earns 1), so every group is rejected. In admission
    # order the first two of each batch's stretch are dropped and the next two kept (flat):
    # batch 1 drops p0 p1 (chunk s1) and keeps p2 p3 (chunk s2); batch 2 drops p4 p5 (s3),
    # keeps p6 p7 (s4). Before, the drops went to whichever groups finished first: with p0
    # late, batch 1 dropped p1 p2 and kept s1r0p0 and s2r0p3.
    expected = [(["s2r0p2", "s2r0p3"], 2.0), (["s4r0p6", "s4r0p7"], 2.0)]
    assert _batches({}) == expected
    assert _batches({"s1r0p0": 0.5}) == expected
    assert _batches({"s1r0p1": 0.5, "s3r0p4": 0.5}) == expected
