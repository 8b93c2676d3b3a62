"""Shape checks shared by every algorithm part: mismatches raise with all the shapes."""

from __future__ import annotations

import torch


def check_tensor(name: str, value: object, shape: str) -> None:
    """Raise ``TypeError`` naming ``name`` unless ``value`` is a ``torch.Tensor`` (of ``shape``,
    as the message words it): a list would otherwise fail later on a missing ``.shape``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shape}, got {type(value).__name__}")


def check_same_shape(**tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming every shape unless all given tensors share one shape.

    ``None`` values are skipped (optional inputs); at least one tensor must be 2-D ``[B, S]``.
    Anything other than a tensor (a list, a numpy array) is a ``TypeError`` naming it.
    """
    given = {name: t for name, t in tensors.items() if t is not None}
    for name, t in given.items():
        check_tensor(name, t, "[B, S]")
    shapes = {name: tuple(t.shape) for name, t in given.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch (all must be [B, S] alike): {listed}")
    for name, shape in shapes.items():
        if len(shape) != 2:
            raise ValueError(f"{name} must be 2-D [B, S], got shape {shape}")
