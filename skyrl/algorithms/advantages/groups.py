"""Per-prompt groups (by uid), per-token broadcasting, and masked whitening.

Sums and means are taken in float64. A float32 mean of equal values can be one rounding
step off them (eight 0.7s average to 0.69999993), and dividing that residue by a std of the
same size turned a group or batch of equal rewards into advantages of about +-1. Float64
holds any sum of float32 values of one scale exactly, so equal values centre to exactly 0.
"""

from __future__ import annotations

import torch


def group_index(uids: list[str], device: torch.device | str | None = None) -> torch.Tensor:
    """``[B]`` int64 group number of each row, numbered in order of first appearance.

    A tensor of ids is refused: its elements hash by identity, so every row would be a group
    of its own (GRPO advantages all 0, ``prompt_mean`` weighing each row as a prompt).
    """
    if isinstance(uids, torch.Tensor):
        raise TypeError(
            "uids must be a list of prompt ids, one per row, got a torch.Tensor (its elements "
            "never compare equal as ids); pass uids.tolist()"
        )
    numbers: dict[str, int] = {}
    index = [numbers.setdefault(uid, len(numbers)) for uid in uids]
    return torch.tensor(index, dtype=torch.long, device=device)


def group_sum_count(values: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sum of ``values [B]`` over the row's group, and the group's size, both ``[B]``
    float64."""
    num_groups = int(group.max()) + 1 if group.numel() else 0
    values = values.to(torch.float64)
    sums = torch.zeros(num_groups, dtype=torch.float64, device=values.device).index_add_(
        0, group, values
    )
    counts = torch.zeros(num_groups, dtype=torch.float64, device=values.device).index_add_(
        0, group, torch.ones_like(values)
    )
    return sums[group], counts[group]


def group_mean_std(
    values: torch.Tensor, group: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, unbiased group std (0 for a group of one) and group size, all ``[B]``
    float64."""
    sums, counts = group_sum_count(values, group)
    mean = sums / counts
    sq_sums, _ = group_sum_count((values.to(torch.float64) - mean) ** 2, group)
    std = torch.where(counts > 1, (sq_sums / (counts - 1).clamp(min=1)).sqrt(), 0.0)
    return mean, std, counts


def broadcast_to_tokens(per_seq: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` -> ``[B, S]``: each sequence's scalar on its loss tokens, exactly 0 elsewhere."""
    return torch.where(loss_mask > 0, per_seq.unsqueeze(1).to(torch.float32), 0.0)


def masked_whiten(values: torch.Tensor, loss_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the loss tokens (unbiased std); 0 off the mask.

    Fewer than two loss tokens: only the mean is removed (the std is undefined). Computed in
    float64, returned in ``values``' dtype, or float32 for integer values (whitened values are
    fractions: an integer dtype would truncate them).
    """
    out_dtype = values.dtype if values.is_floating_point() else torch.float32
    mask = loss_mask > 0
    x = torch.where(mask, values.to(torch.float64), 0.0)
    n = mask.sum()
    mean = x.sum() / n.clamp(min=1)
    centered = torch.where(mask, x - mean, 0.0)
    var = (centered**2).sum() / (n - 1).clamp(min=1)
    scale = torch.where(n > 1, var.sqrt() + eps, 1.0)
    return torch.where(mask, centered / scale, 0.0).to(out_dtype)
