"""DAPO's batch shaping on rollouts: group filtering and overlong handling.

A group is all trajectories of one prompt (one ``uid``). When every reward in
a group is equal, a group-relative advantage is zero for all of it: it only
dilutes the batch. ``filter`` drops such groups and samples more prompts;
``replace`` swaps each for a copy of a group that does carry signal.

Which groups count as informative is pluggable (``algorithm.dynamic_filter``): a
group filter ``(group) -> keep?`` registered in ``GROUP_FILTERS`` or named by import
path. The default, ``reward_variance``, is the zero-variance test above.

The soft overlong penalty measures a trajectory as ``generator.max_generate_length`` bounds
it: every token after the prompt, observations between turns included. DAPO's responses are
single-turn, where this is the sampled length; in multi-turn rollouts it makes a trajectory
that the limit cut get the full penalty.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from typing import cast

from skyrl.config.errors import ConfigError, did_you_mean, require
from skyrl.config.root import SkyRLConfig
from skyrl.generators.output import GeneratorOutput
from skyrl.registry import Registry, import_path, unbindable_parameters

TRUNCATED = ("length", "budget")
"""Stop reasons of a trajectory cut by the token limit."""

GroupFilter = Callable[[GeneratorOutput], bool]
"""``(group) -> keep?``: ``group`` holds the rows of one prompt uid (every sample, every
turn); True keeps it as informative."""

GROUP_FILTERS: Registry[GroupFilter] = Registry("group filter")
"""Group filters by name, for ``algorithm.dynamic_filter``; a recipe registers its own."""

_KEY = "algorithm.dynamic_filter"


@GROUP_FILTERS.register("reward_variance")
def reward_variance(group: GeneratorOutput) -> bool:
    """Keep a group whose trajectory rewards (on last steps) are not all equal."""
    rewards = {r for r, last in zip(group.rewards, group.is_last_step, strict=True) if last}
    return len(rewards) > 1


def group_filter(name: str) -> GroupFilter:
    """The filter ``algorithm.dynamic_filter`` names: a registered name or an import path
    ``package.module.attr`` (``attr`` may be dotted) of a function callable as ``keep(group)``.
    Anything else raises a ``ConfigError`` for ``algorithm.dynamic_filter``."""
    if name in GROUP_FILTERS:
        target = GROUP_FILTERS.get(name)
        problem = _not_a_filter(name, target)
        if not problem:
            return target
        raise ConfigError(_KEY, problem)
    if "." not in name:
        raise ConfigError(
            _KEY,
            f"{GROUP_FILTERS.unknown(name)}{did_you_mean(name, GROUP_FILTERS.names())} "
            "(or an import path module.attr)",
        )
    try:
        target = import_path(name)
    except ValueError as exc:
        problem = str(exc)
    else:
        problem = _not_a_filter(name, target)
        if not problem:
            return cast(GroupFilter, target)
    raise ConfigError(_KEY, problem)  # outside the handler: no exception context


def _not_a_filter(name: str, target: Callable) -> str:
    """Why ``target`` cannot be called as a group filter, ``keep(group)`` ("" if it can; a
    signature Python cannot read is given the benefit of the doubt). Found here, at the
    config check, not after the first sampling round."""
    listed = unbindable_parameters(target, 1)
    if listed is None:
        return ""
    return (
        f"{name} takes ({listed}): a group filter takes one argument, the group's "
        "GeneratorOutput, and returns True to keep it"
    )


def check_dynamic_filter(cfg: SkyRLConfig) -> None:
    """``algorithm.dynamic_filter`` of a ``SkyRLConfig`` names a registered or importable
    filter (checked whatever ``dynamic_sampling`` is, so a typo is found before it is used),
    and that ``reward_variance`` has groups of several samples to compare."""
    a = cfg.algorithm
    group_filter(a.dynamic_filter)
    if a.dynamic_sampling and a.dynamic_filter == "reward_variance":
        n = cfg.generator.n_samples_per_prompt
        require(
            n > 1,
            "algorithm.dynamic_sampling",
            "the 'reward_variance' filter keeps groups whose samples' rewards differ: with "
            f"generator.n_samples_per_prompt={n} no group can, so every round is dropped; "
            "sample >= 2 per prompt or use another algorithm.dynamic_filter",
        )


def group_rows(output: GeneratorOutput) -> dict[str, list[int]]:
    """Row indices of each uid, in first-seen order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, uid in enumerate(output.uids):
        groups[uid].append(i)
    return dict(groups)


def informative_uids(output: GeneratorOutput, keep: GroupFilter = reward_variance) -> list[str]:
    """Uids, in first-seen order, of the groups ``keep`` keeps (default: rewards on last
    steps not all equal)."""
    return [uid for uid, rows in group_rows(output).items() if keep(output.select_rows(rows))]


def keep_groups(output: GeneratorOutput, uids: list[str]) -> GeneratorOutput:
    """Only the rows of ``uids``, groups in the order given."""
    groups = group_rows(output)
    return output.select_rows([i for uid in uids for i in groups[uid]])


def replace_flat_groups(
    output: GeneratorOutput, seed: int, keep: GroupFilter = reward_variance
) -> tuple[GeneratorOutput, int]:
    """Each group ``keep`` rejects (default: zero variance) replaced by a copy (new uid) of a
    random kept group; returns the new output and the number replaced. Unchanged when no
    group is kept."""
    good = informative_uids(output, keep)
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
    """DAPO soft overlong punishment, in place: a trajectory of ``L`` tokens after its prompt
    (``response_lengths``) with ``L > max - buffer`` gets ``-(L - (max - buffer)) / buffer *
    factor`` (at most ``-factor``) added to its reward. Returns the mean penalty over
    trajectories."""
    lengths = response_lengths(output)
    start = max_generate_length - buffer_len
    total = 0.0
    for i, (tid, last) in enumerate(zip(output.trajectory_ids, output.is_last_step, strict=True)):
        if not last:
            continue
        over = max(0, lengths[tid] - start)
        penalty = -min(over / buffer_len, 1.0) * factor
        output.rewards[i] += penalty
        total += penalty
    return total / max(1, len(lengths))


def response_lengths(output: GeneratorOutput) -> dict[str, int]:
    """Tokens of each trajectory after its prompt as ``generator.max_generate_length`` bounds
    them: sampled tokens and the observations between turns (the agent loop's budget, the
    external-agent backend's room), not just the sampled ones (the loss mask), so a trajectory
    the limit cut measures ``max_generate_length``. Counted on its last row from the prompt of
    that row (whole-trajectory rows; a forked row starts a new count) or of the turn that
    began the count (step-wise rows: its first turn, or its last fork)."""
    lengths: dict[str, int] = {}
    start, previous = 0, None
    for tid, prompt, response, fork in zip(
        output.trajectory_ids, output.prompt_token_ids, output.response_token_ids, output.forks,
        strict=True,
    ):  # fmt: skip
        if tid != previous or fork or not output.step_wise:
            start = len(prompt)
        lengths[tid] = len(prompt) + len(response) - start
        previous = tid
    return lengths


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
