"""Loss reductions, expressed as per-token weights over one whole mini-batch.

A reduction maps ``loss_mask [B, S]`` of one mini-batch (all sequences of
``policy_mini_batch_size`` prompts, before DP padding or micro-batch packing)
to weights ``w [B, S]`` such that the reduced loss is ``(per_token_loss * w).sum()``.
Because the weights are fixed before packing, the mini-batch loss is exactly
the sum of the micro-batch losses ``(loss_mb * w_mb).sum()`` under any packing
(ragged last micro batch, zero-loss padding rows, any split over DP ranks).

Counts are over *sequences that have at least one loss token*, so adding
all-zero padding rows never changes the weights, whenever the reduction runs.

- ``token_mean``: every loss token weighs the same (DAPO, Yu et al. 2025).
- ``sequence_mean``: mean over sequences of each sequence's token mean (the GRPO paper's, Shao
  et al. 2024; the ``grpo`` preset reduces with ``token_mean``).
- ``seq_mean_token_sum_norm``: each sequence's token *sum* divided by the constant
  ``max_seq_len``, mean over sequences (Dr.GRPO, Liu et al. 2025: no length bias).
- ``prompt_mean``: token mean within each prompt group (all its samples and turns),
  then mean over prompts, so every prompt weighs the same however many turns it had.
"""

from __future__ import annotations

import torch

from skyrl.algorithms.registry import LOSS_REDUCTIONS
from skyrl.algorithms.shapes import check_tensor


def _as_bool(loss_mask: torch.Tensor) -> torch.Tensor:
    return loss_mask > 0


@LOSS_REDUCTIONS.register("token_mean")
def token_mean(loss_mask: torch.Tensor, uids: list[str], max_seq_len: int) -> torch.Tensor:
    """``w = m / sum(m)``: the mean over all loss tokens of the mini-batch."""
    mask = _as_bool(loss_mask)
    num_tokens = mask.sum()
    return torch.where(mask, 1.0 / num_tokens.clamp(min=1), 0.0)


@LOSS_REDUCTIONS.register("sequence_mean")
def sequence_mean(loss_mask: torch.Tensor, uids: list[str], max_seq_len: int) -> torch.Tensor:
    """``w_it = m_it / (|y_i| * num_seqs)``: mean over sequences of per-sequence token means."""
    mask = _as_bool(loss_mask)
    seq_tokens = mask.sum(dim=1, keepdim=True)
    num_seqs = (seq_tokens > 0).sum()
    return torch.where(mask, 1.0 / (seq_tokens.clamp(min=1) * num_seqs.clamp(min=1)), 0.0)


@LOSS_REDUCTIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    loss_mask: torch.Tensor, uids: list[str], max_seq_len: int
) -> torch.Tensor:
    """``w_it = m_it / (max_seq_len * num_seqs)``: token sum over a constant length (Dr.GRPO)."""
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    mask = _as_bool(loss_mask)
    num_seqs = (mask.sum(dim=1) > 0).sum()
    return torch.where(mask, 1.0 / (max_seq_len * num_seqs.clamp(min=1)), 0.0)


@LOSS_REDUCTIONS.register("prompt_mean")
def prompt_mean(loss_mask: torch.Tensor, uids: list[str], max_seq_len: int) -> torch.Tensor:
    """``w_it = m_it / (tokens of prompt(i) * num_prompts)``: every prompt group weighs the same."""
    from skyrl.algorithms.advantages.groups import group_index

    mask = _as_bool(loss_mask)
    group = group_index(uids, device=mask.device)
    num_groups = int(group.max()) + 1 if len(uids) else 0
    group_tokens = torch.zeros(num_groups, dtype=torch.float64, device=mask.device)
    group_tokens.index_add_(0, group, mask.sum(dim=1).to(torch.float64))
    num_prompts = (group_tokens > 0).sum()
    row_tokens = group_tokens[group].unsqueeze(1)
    return torch.where(
        mask, 1.0 / (row_tokens.clamp(min=1) * num_prompts.clamp(min=1)), 0.0
    ).float()


def compute_loss_weights(
    name: str, loss_mask: torch.Tensor, uids: list[str], max_seq_len: int
) -> torch.Tensor:
    """Per-token weights ``[B, S]`` (float32) of the registered reduction ``name`` for one mini-batch.

    Call once per mini-batch before padding or packing; store the result with the batch
    and reduce each micro batch as ``(per_token_loss * loss_weights).sum()``.
    """
    check_tensor("loss_mask", loss_mask, "[B, S]")
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be 2-D [B, S], got shape {tuple(loss_mask.shape)}")
    if len(uids) != loss_mask.shape[0]:
        raise ValueError(f"got {len(uids)} uids for loss_mask of shape {tuple(loss_mask.shape)}")
    weights = LOSS_REDUCTIONS.get(name)(loss_mask, uids, max_seq_len)
    if not isinstance(weights, torch.Tensor) or weights.shape != loss_mask.shape:
        got = (
            f"shape {tuple(weights.shape)}"
            if isinstance(weights, torch.Tensor)
            else type(weights).__name__
        )
        raise ValueError(
            f"loss reduction {name!r} returned {got}, expected a tensor of shape "
            f"{tuple(loss_mask.shape)} (one weight per token)"
        )
    return torch.where(loss_mask > 0, weights.float(), 0.0)
