"""An asynchronous run's checkpoint resumed synchronously (``trainer.max_staleness=0``) trains
the prompts the asynchronous stream had drawn and not trained on (its ``pending``), first, as a
resumed asynchronous stream does; the loader had moved past them, so they were skipped for the
rest of their epoch."""

from __future__ import annotations

from async_helpers import EchoEngine, async_cfg, next_batch_within, tokenizer_of

from skyrl.rollouts.async_rollouts import AsyncRollouts
from skyrl.rollouts.sync import SyncRollouts


def _prompts(batch) -> list[tuple[int, ...]]:
    """The prompt of each group of ``batch``, in the batch's order (its first row's tokens up
    to the response; every prompt of the echo run is trained with the same response)."""
    seen: dict[str, tuple[int, ...]] = {}
    mask = batch.loss_mask.tolist()
    for uid, ids, m in zip(batch.metadata["uids"], batch.input_ids.tolist(), mask, strict=True):
        seen.setdefault(uid, tuple(ids[: m.index(1)]))
    return list(seen.values())


def test_an_async_checkpoint_resumed_synchronously_trains_the_prompts_in_flight_first(tmp_path):
    # 8 prompts, batch 2, k = 1: after step 1 and its sync the stream holds chunks 2 and 3
    # (4 prompts) drawn and not trained on; they are the checkpoint's pending. The synchronous
    # source resumed from it drew the epoch's last chunk and then a new epoch: those 4
    # prompts were never trained in that epoch.
    cfg = async_cfg("trainer.max_staleness=1")
    tok = tokenizer_of(cfg)
    stream = AsyncRollouts(cfg, EchoEngine(tok), tok, tmp_path)
    try:
        next_batch_within(stream, 1)
        with stream.updating_weights(1, timeout_s=10):
            pass
        state = stream.state_dict()
        want = [p for step in (2, 3, 4) for p in _prompts(next_batch_within(stream, step)[0])]
    finally:
        stream.close()
    assert len(state["pending"]) == 4

    resumed = SyncRollouts(async_cfg(), EchoEngine(tok), tok, tmp_path)
    resumed.load_state_dict(state)
    got = [p for step in (2, 3, 4) for p in _prompts(resumed.next_batch(step)[0])]
    assert got == want
    assert len(set(got)) == 6  # the epoch's 6 prompts after step 1's 2, none twice
