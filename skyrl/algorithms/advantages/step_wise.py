"""Step-wise training: advantages from each trajectory's last step, given to all its turns.

In step-wise mode every LLM turn is its own training sequence. Outcome
estimators (grpo, rloo, ...) are run on the last step of each trajectory only
(the rows with ``is_last_step``; their uids group the samples of a prompt), and
that step's scalar advantage is copied to the loss tokens of every turn of the
same trajectory. Per-token estimators (gae, reinforce_pp) are refused for
step-wise by ``skyrl/config/validate.py``.

Two things span every turn, not only the last: the ``token_rewards`` (KL in reward) of all
of a trajectory's turns add to its score, and batch whitening (``advantage_whitening``, and
the one ``reinforce_pp_baseline`` does) runs over every trained token of the batch, as it
does when a whole trajectory is one row.
"""

from __future__ import annotations

import dataclasses

import torch

from skyrl.algorithms.advantages.compute import compute_advantages
from skyrl.algorithms.advantages.groups import broadcast_to_tokens, masked_whiten
from skyrl.algorithms.advantages.inputs import AdvantageInputs
from skyrl.config.algorithm import AlgorithmConfig

WHITENED_ESTIMATORS = {"reinforce_pp_baseline": "dr_grpo"}
"""Outcome estimators that are another one followed by batch whitening (REINFORCE++-baseline
is the group-mean baseline, whitened): step-wise runs the other one on the last steps and
whitens after broadcasting, over every turn's tokens."""


def trajectory_ids_from_last_steps(is_last_step: list[bool]) -> list[int]:
    """Trajectory number of each row, for rows where each trajectory's steps are contiguous and end with True."""
    if is_last_step and not is_last_step[-1]:
        raise ValueError(
            "the last row must have is_last_step=True (a trajectory ends with its last step)"
        )
    ids, current = [], 0
    for last in is_last_step:
        ids.append(current)
        current += int(last)
    return ids


def broadcast_last_step_advantages(
    inputs: AdvantageInputs,
    cfg: AlgorithmConfig,
    is_last_step: list[bool],
    trajectory_ids: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns) [B, S]``: each row gets its trajectory's last-step scalar on its loss tokens.

    ``trajectory_ids`` (any hashable per row) overrides the contiguous-rows rule;
    each trajectory must then have exactly one row with ``is_last_step``.
    The last step's scalar is the mean of its advantages over its loss tokens
    (constant for outcome estimators); a last step with no loss tokens gives 0.
    """
    batch = len(inputs.uids)
    if len(is_last_step) != batch:
        raise ValueError(f"got {len(is_last_step)} is_last_step flags for {batch} rows")
    if trajectory_ids is None:
        trajectory_ids = trajectory_ids_from_last_steps(is_last_step)
    elif len(trajectory_ids) != batch:
        raise ValueError(f"got {len(trajectory_ids)} trajectory_ids for {batch} rows")
    last_row: dict = {}
    for row, (traj, last) in enumerate(zip(trajectory_ids, is_last_step, strict=True)):
        if last:
            if traj in last_row:
                raise ValueError(
                    f"trajectory {traj!r} has more than one row with is_last_step=True"
                )
            last_row[traj] = row
    missing = sorted({str(t) for t in trajectory_ids if t not in last_row})
    if missing:
        raise ValueError(f"trajectories without a last step: {', '.join(missing)}")

    device = inputs.loss_mask.device
    last_rows = torch.tensor(sorted(last_row.values()), dtype=torch.long, device=device)
    # each row's trajectory's last row
    source = torch.tensor([last_row[t] for t in trajectory_ids], dtype=torch.long, device=device)
    whitened = cfg.advantage_estimator in WHITENED_ESTIMATORS
    whiten = cfg.advantage_whitening or whitened
    last_cfg = dataclasses.replace(
        cfg,
        advantage_estimator=WHITENED_ESTIMATORS.get(
            cfg.advantage_estimator, cfg.advantage_estimator
        ),
        advantage_whitening=False,
    )
    adv_last, ret_last = compute_advantages(_last_steps(inputs, last_rows, source), last_cfg)
    mask_last = inputs.loss_mask[last_rows] > 0
    n_tokens = mask_last.sum(dim=1).clamp(min=1)
    scalar_adv = torch.zeros(batch, device=device)
    scalar_ret = torch.zeros(batch, device=device)
    # float64 (see ``groups``): the float32 mean of n equal values can be one rounding step
    # off them, and batch whitening blew that residue up to advantages of about +-1
    scalar_adv[last_rows] = (adv_last.double().sum(dim=1) / n_tokens).float()
    scalar_ret[last_rows] = (ret_last.double().sum(dim=1) / n_tokens).float()
    mask = inputs.loss_mask
    adv = broadcast_to_tokens(scalar_adv[source], mask)
    ret = broadcast_to_tokens(scalar_ret[source], mask)
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv, adv if whitened else ret


def _last_steps(
    inputs: AdvantageInputs, last_rows: torch.Tensor, source: torch.Tensor
) -> AdvantageInputs:
    """The last-step rows, each carrying its whole trajectory's ``token_rewards``: their masked
    sum over every turn is added to the outcome reward (all an outcome estimator reads)."""
    last = inputs.select(last_rows)
    if inputs.token_rewards is None:
        return last
    per_row = torch.where(inputs.mask, inputs.token_rewards, 0.0).sum(dim=1).to(torch.float64)
    per_trajectory = torch.zeros_like(per_row).index_add_(0, source, per_row)
    rewards = last.rewards.to(torch.float64) + per_trajectory[last_rows]
    return dataclasses.replace(last, rewards=rewards.to(torch.float32), token_rewards=None)
