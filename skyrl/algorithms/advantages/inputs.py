"""What an advantage estimator reads: ``AdvantageInputs``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skyrl.algorithms.shapes import check_same_shape, check_tensor


@dataclass
class AdvantageInputs:
    """One batch for advantage estimation; token tensors are aligned with ``input_ids``.

    Attributes:
        rewards: ``[B]`` outcome reward of each sequence (env / reward fn score).
        loss_mask: ``[B, S]`` 1.0 on trained response tokens, 0 elsewhere.
        uids: ``B`` prompt ids; rows of one prompt form one group.
        values: ``[B, S]`` critic values at each token (``gae`` only).
        token_rewards: ``[B, S]`` extra per-token rewards, e.g. ``-kl_coef * kl`` when
            ``use_kl_in_reward``; outcome estimators add their masked sum to ``rewards``.
    """

    rewards: torch.Tensor
    loss_mask: torch.Tensor
    uids: list[str]
    values: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_same_shape(
            loss_mask=self.loss_mask, values=self.values, token_rewards=self.token_rewards
        )
        check_tensor("rewards", self.rewards, "[B]")
        batch = self.loss_mask.shape[0]
        if tuple(self.rewards.shape) != (batch,):
            raise ValueError(f"rewards must be [B]={batch}, got shape {tuple(self.rewards.shape)}")
        if len(self.uids) != batch:
            raise ValueError(
                f"got {len(self.uids)} uids for loss_mask of shape {tuple(self.loss_mask.shape)}"
            )

    @property
    def mask(self) -> torch.Tensor:
        """``loss_mask`` as bool."""
        return self.loss_mask > 0

    def sequence_rewards(self) -> torch.Tensor:
        """``[B]`` float32: outcome reward plus the masked sum of ``token_rewards`` (if any)."""
        total = self.rewards.to(torch.float32)
        if self.token_rewards is not None:
            total = total + torch.where(self.mask, self.token_rewards, 0.0).sum(dim=1)
        return total

    def token_level_rewards(self) -> torch.Tensor:
        """``[B, S]``: ``token_rewards`` on loss tokens plus the outcome reward on each row's last loss token."""
        mask = self.mask
        per_token = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        if self.token_rewards is not None:
            per_token = torch.where(mask, self.token_rewards.to(torch.float32), 0.0)
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(mask, positions, -1).max(dim=1).values
        rows = torch.nonzero(last >= 0).squeeze(1)
        per_token[rows, last[rows]] += self.rewards.to(torch.float32)[rows]
        return per_token

    def select(self, rows: torch.Tensor) -> AdvantageInputs:
        """The sub-batch of the given row indices."""
        idx = rows.tolist()
        return AdvantageInputs(
            rewards=self.rewards[rows],
            loss_mask=self.loss_mask[rows],
            uids=[self.uids[i] for i in idx],
            values=None if self.values is None else self.values[rows],
            token_rewards=None if self.token_rewards is None else self.token_rewards[rows],
        )
