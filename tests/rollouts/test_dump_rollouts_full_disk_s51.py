"""``trainer.dump_rollouts`` on a full disk: one error line, as a failed metrics or checkpoint
write gives, from both rollout sources."""

from __future__ import annotations

import pytest
from async_helpers import EchoEngine, async_cfg, next_batch_within, tokenizer_of

from skyrl.rollouts.async_rollouts import AsyncRollouts
from skyrl.rollouts.sync import SyncRollouts
from skyrl.trainer.trainer import TrainingAborted


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_rollout_dump_that_cannot_be_written_ends_the_run_in_one_line(tmp_path, staleness):
    # step 2's dump goes to /dev/full (every write: ENOSPC, a full disk). The dump comes
    # before the step's metrics and checkpoint, so the run ended with a traceback ending in
    # "OSError: [Errno 28] No space left on device" instead of the one line those give.
    cfg = async_cfg(f"trainer.max_staleness={staleness}", "trainer.dump_rollouts=true")
    tok = tokenizer_of(cfg)
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_2.jsonl").symlink_to("/dev/full")
    kind = AsyncRollouts if staleness else SyncRollouts
    source = kind(cfg, EchoEngine(tok), tok, tmp_path)
    try:
        next_batch_within(source, 1)
        with pytest.raises(TrainingAborted) as caught:
            next_batch_within(source, 2)
    finally:
        source.close()
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(
        f"writing the rollouts of step 2 (trainer.dump_rollouts) into "
        f"{tmp_path / 'rollouts' / 'step_2.jsonl'} failed ("
    )
    assert line.endswith("free there); [Errno 28] No space left on device")
    assert (tmp_path / "rollouts" / "step_1.jsonl").read_text().count("\n") == 4  # 2 x 2 rows
