"""Mini-batch boundaries in PROMPT units.

A mini-batch holds all sequences of exactly ``mini_batch_size`` prompts, so
the number of optimizer steps per training batch is
``train_batch_size / mini_batch_size * update_epochs_per_batch`` whatever the
number of turns per sample (step-wise training gives a variable number of
sequences per prompt). Rows of one prompt (same uid) must be contiguous.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import compress, islice


def _run_starts(uids: Sequence[str]) -> list[int]:
    """Start index of each run of equal consecutive uids (C-level iteration:
    no per-row Python bytecode, no object array)."""
    uids = uids if isinstance(uids, list) else list(uids)
    changed = map(operator.ne, islice(uids, 1, None), uids)
    return [0, *compress(range(1, len(uids)), changed)]


def _raise_non_contiguous(uids: Sequence[str], starts: list[int]) -> None:
    seen: set[str] = set()
    for start in starts:
        uid = uids[start]
        if uid in seen:
            raise ValueError(
                f"uid {uid!r} re-appears at index {start} after a gap: rows of one prompt "
                "must be contiguous"
            )
        seen.add(uid)


def compute_prompt_boundaries(uids: Sequence[str]) -> list[tuple[int, int]]:
    """One ``(start, end)`` per run of consecutive equal uids; ``[]`` if empty.

    Raises ValueError naming the uid and index if a uid re-appears after a gap.
    """
    if len(uids) == 0:
        return []
    starts = _run_starts(uids)
    if len(set(map(uids.__getitem__, starts))) != len(starts):
        _raise_non_contiguous(uids, starts)
    return list(zip(starts, [*starts[1:], len(uids)], strict=True))


def _check_sizes(train_batch_size: int, mini_batch_size: int) -> None:
    """A ``ValueError`` naming both unless ``train_batch_size`` is a positive multiple of a
    positive ``mini_batch_size``."""
    if mini_batch_size < 1 or train_batch_size < 1 or train_batch_size % mini_batch_size:
        raise ValueError(
            f"train_batch_size ({train_batch_size}) must be a positive multiple of "
            f"mini_batch_size ({mini_batch_size})"
        )


def compute_prompt_mini_batch_boundaries(
    uids: Sequence[str],
    mini_batch_size: int,
    train_batch_size: int,
    step_wise: bool = False,
    n_samples_per_prompt: int | None = None,
) -> list[tuple[int, int]]:
    """Contiguous ``(start, end)`` row ranges, each covering ``mini_batch_size`` prompts.

    Returns ``train_batch_size // mini_batch_size`` pairs. Without
    ``step_wise`` every prompt has the same number ``n`` of rows (given, or
    ``len(uids) // train_batch_size``) and boundary ``i`` is exactly
    ``[i*n*m, (i+1)*n*m)``: the same as fixed-size slicing.
    """
    _check_sizes(train_batch_size, mini_batch_size)
    prompts = compute_prompt_boundaries(uids)
    if len(prompts) != train_batch_size:
        raise ValueError(
            f"the batch holds {len(prompts)} distinct prompts (uids), expected "
            f"train_batch_size = {train_batch_size}"
        )
    m = mini_batch_size
    bounds = [(prompts[i][0], prompts[i + m - 1][1]) for i in range(0, len(prompts), m)]
    if not step_wise:
        n = n_samples_per_prompt or len(uids) // train_batch_size
        fixed = [(i * n * m, (i + 1) * n * m) for i in range(len(bounds))]
        if bounds != fixed:
            raise ValueError(
                f"without step-wise training every prompt must have {n} rows: prompt "
                f"boundaries {bounds} differ from fixed-size slices {fixed}"
            )
    return bounds


def optimizer_steps_per_batch(
    train_batch_size: int, mini_batch_size: int, update_epochs_per_batch: int = 1
) -> int:
    """Optimizer steps per training batch: ``train_batch_size / mini_batch_size * epochs``."""
    _check_sizes(train_batch_size, mini_batch_size)
    if update_epochs_per_batch < 1:
        raise ValueError(f"update_epochs_per_batch must be >= 1, got {update_epochs_per_batch}")
    return train_batch_size // mini_batch_size * update_epochs_per_batch
