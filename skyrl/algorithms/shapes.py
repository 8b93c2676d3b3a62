"""Shape checks shared by every algorithm part: mismatches raise with all the shapes."""

from __future__ import annotations

import torch


def check_same_shape(**tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming every shape unless all given tensors share one shape.

    ``None`` values are skipped (optional inputs); at least one tensor must be 2-D ``[B, S]``.
    """
    given = {name: t for name, t in tensors.items() if t is not None}
    shapes = {name: tuple(t.shape) for name, t in given.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch (all must be [B, S] alike): {listed}")
    for name, shape in shapes.items():
        if len(shape) != 2:
            raise ValueError(f"{name} must be 2-D [B, S], got shape {shape}")
