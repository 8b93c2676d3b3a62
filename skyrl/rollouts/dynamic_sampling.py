"""DAPO's batch shaping on rollouts: zero-variance group filtering and overlong handling.

A group is all trajectories of one prompt (one ``uid``). When every reward in
a group is equal, a group-relative advantage is zero for all of it: it only
dilutes the batch. ``filter`` drops such groups and samples more prompts;
``replace`` swaps each for a copy of a group that does carry signal.
"""

from __future__ import annotations

import random
from collections import defaultdict

from skyrl.generators.output import GeneratorOutput

TRUNCATED = ("length", "budget")
"""Stop reasons of a trajectory cut by the token limit."""


def group_rows(output: GeneratorOutput) -> dict[str, list[int]]:
    """Row indices of each uid, in first-seen order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, uid in enumerate(output.uids):
        groups[uid].append(i)
    return dict(groups)


def informative_uids(output: GeneratorOutput) -> list[str]:
    """Uids whose trajectory rewards (on last steps) are not all equal."""
    rewards: dict[str, set[float]] = defaultdict(set)
    for uid, reward, last in zip(output.uids, output.rewards, output.is_last_step, strict=True):
        if last:
            rewards[uid].add(reward)
    return [uid for uid in group_rows(output) if len(rewards[uid]) > 1]


def keep_groups(output: GeneratorOutput, uids: list[str]) -> GeneratorOutput:
    """Only the rows of ``uids``, groups in the order given."""
    groups = group_rows(output)
    return output.select_rows([i for uid in uids for i in groups[uid]])


def replace_flat_groups(output: GeneratorOutput, seed: int) -> tuple[GeneratorOutput, int]:
    """Each zero-variance group replaced by a copy (new uid) of a random informative group;
    returns the new output and the number replaced. Unchanged when no group is informative."""
    good = informative_uids(output)
    groups = group_rows(output)
    flat = [uid for uid in groups if uid not in set(good)]
    if not good or not flat:
        return output, 0
    rng = random.Random(seed)
    parts = [keep_groups(output, good)]
    for uid in flat:
        source = rng.choice(good)
        copy = keep_groups(output, [source])
        new_uid = f"{uid}~{source}"
        copy.uids = [new_uid] * len(copy)
        copy.trajectory_ids = [new_uid + "/" + t.rsplit("/", 1)[1] for t in copy.trajectory_ids]
        parts.append(copy)
    return GeneratorOutput.concat(parts), len(flat)


def overlong_penalty(
    output: GeneratorOutput, max_generate_length: int, buffer_len: int, factor: float
) -> float:
    """DAPO soft overlong punishment, in place: a trajectory that generated ``L`` tokens with
    ``L > max - buffer`` gets ``-(L - (max - buffer)) / buffer * factor`` (at most ``-factor``)
    added to its reward. Returns the mean penalty over trajectories."""
    generated: dict[str, int] = defaultdict(int)
    for tid, mask in zip(output.trajectory_ids, output.loss_masks, strict=True):
        generated[tid] += int(sum(mask))
    start = max_generate_length - buffer_len
    total = 0.0
    for i, (tid, last) in enumerate(zip(output.trajectory_ids, output.is_last_step, strict=True)):
        if not last:
            continue
        over = max(0, generated[tid] - start)
        penalty = -min(over / buffer_len, 1.0) * factor
        output.rewards[i] += penalty
        total += penalty
    return total / max(1, len(generated))


def mask_truncated(output: GeneratorOutput) -> int:
    """Overlong filtering, in place: zero the loss mask of every row of a truncated trajectory.
    Returns the number of trajectories masked."""
    cut = {
        t for t, r in zip(output.trajectory_ids, output.stop_reasons, strict=True) if r in TRUNCATED
    }
    for i, tid in enumerate(output.trajectory_ids):
        if tid in cut:
            output.loss_masks[i] = [0] * len(output.loss_masks[i])
    return len(cut)
