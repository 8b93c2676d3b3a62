"""The stream's dynamic-sampling warnings name their step, as the synchronous source's do:
under Python's default warning filter an identical message shows once per run, so the flat
groups kept in every later batch went unreported."""

from __future__ import annotations

import warnings

from async_helpers import TimedEngine, next_batch_within, tokenizer_of
from test_async_resume_filter_s49 import flat_filter_cfg

from skyrl.rollouts.async_rollouts import AsyncRollouts


def test_each_batch_that_keeps_flat_groups_warns_once_under_the_default_filter():
    # Every group flat, batch 2, max_sample_batches 2: each batch drops 2 groups and keeps
    # 2 flat ones, so each of the 3 batches warns; before, all three messages were the same
    # text and the default filter ("default": once per message and place) showed one.
    cfg = flat_filter_cfg()
    tok = tokenizer_of(cfg)
    source = AsyncRollouts(cfg, TimedEngine(tok, {}), tok)
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("default")  # Python's own action for UserWarning
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        try:
            for step in (1, 2, 3):
                next_batch_within(source, step)
                with source.updating_weights(step, timeout_s=10):
                    pass
        finally:
            source.close()
    assert shown == [
        f"step {s}: dynamic sampling: 2 group(s) the filter rejected were kept after it "
        "dropped 2 (algorithm.max_sample_batches)"
        for s in (1, 2, 3)
    ]
