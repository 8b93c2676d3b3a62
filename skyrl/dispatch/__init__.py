"""Dispatch: stage each mini-batch, pad it to dp_size and route chunks to DP ranks."""

from skyrl.dispatch.mesh import (
    MeshDispatch,
    StagedMiniBatches,
    assign_rows_to_ranks,
    token_imbalance,
)

__all__ = ["MeshDispatch", "StagedMiniBatches", "assign_rows_to_ranks", "token_imbalance"]
