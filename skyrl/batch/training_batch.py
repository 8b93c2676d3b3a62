"""`TrainingInputBatch`: the named tensors and metadata that flow from the
generator to the training workers, and `pad_training_input_batch`.

Layout (every stage relies on it):

- Token-level tensors are ``[B, S]``, right-padded and aligned with
  ``input_ids``: position ``t`` holds the value for token ``t`` (a logprob at
  ``t`` is ``log p(token_t | tokens_<t)``, 0 at ``t = 0``).
- ``input_ids`` (long), ``attention_mask`` (1 on real tokens), ``loss_mask``
  (float, 1 on trained response tokens); optional float ``[B, S]`` fields
  ``advantages``, ``returns``, ``old_logprobs``, ``ref_logprobs``,
  ``rollout_logprobs``, ``values``, ``loss_weights``; optional ``rewards``
  (float ``[B]``). A row's real length is ``attention_mask[i].sum()``.
- ``metadata``: values that are lists are per-row (length ``B``, sliced with
  the rows): ``uids``, ``is_last_step``, ``trajectory_ids``, ``is_padding``.
  Anything else (``pad_size: int``, ...) is batch-level and copied as is.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
import torch

TOKEN_FIELDS = (
    "input_ids",
    "attention_mask",
    "loss_mask",
    "advantages",
    "returns",
    "old_logprobs",
    "ref_logprobs",
    "rollout_logprobs",
    "values",
    "loss_weights",
)
"""Known token-level ``[B, S]`` fields (others are allowed too)."""

ROW_FIELDS = ("rewards",)
"""Known per-row ``[B]`` fields."""

KNOWN_FIELDS = TOKEN_FIELDS + ROW_FIELDS

RowIndex = int | slice | Sequence[int] | np.ndarray | torch.Tensor


class RowMetadata(TypedDict, total=False):
    """The metadata a batch may carry. Per-row lists have one entry per row (``B``)."""

    uids: list[str]
    """Prompt id of each row (shared by every sample and turn of one prompt)."""
    trajectory_ids: list[str]
    """``<uid>/<sample>``."""
    is_last_step: list[bool]
    """True on the last row of each trajectory."""
    data_sources: list[str]
    stop_reasons: list[str]
    policy_versions: list[list[tuple[int, int]]]
    """Per row, ``(version at dispatch, version at finish)`` of each LLM turn it holds."""
    forks: list[str]
    """Per row, why it does not extend the previous row of its trajectory (``""``: it does)."""
    is_padding: list[bool]
    """True on rows ``pad_training_input_batch`` added (zero loss)."""
    source_rows: list[int]
    """Per chunk row, its row in the staged batch (-1 for padding; set by dispatch)."""
    pad_size: int
    """Rows added by ``pad_training_input_batch``."""
    mini_batch_index: int
    """Which mini-batch of the step a staged chunk belongs to (dispatch)."""
    rank_token_imbalance: float
    """Busiest rank's tokens over the least busy rank's, for the chunk's mini-batch
    (dispatch, ``skyrl.dispatch.mesh.token_imbalance``)."""
    old_logprobs_from_training: bool
    """The batch has no old logprobs: the step is exactly on-policy and the training forward's
    own logprobs are the old ones (set by the trainer, ``skyrl.trainer.on_policy``)."""


class TrainingInputBatch:
    """Named tensors sharing the first dimension ``B``, plus ``metadata``.

    ``batch["advantages"]`` / ``batch.advantages`` give the tensor, or None for a
    known field that is absent. ``batch[a:b]`` / ``batch[index_list]`` select
    rows (per-row metadata lists too). Operations return new batches; tensors
    are shared (views) where torch allows, never written in place.
    """

    def __init__(
        self, tensors: Mapping[str, torch.Tensor | None], metadata: Mapping[str, Any] | None = None
    ):
        self.tensors: dict[str, torch.Tensor] = {k: v for k, v in tensors.items() if v is not None}
        self.metadata: dict[str, Any] = dict(metadata or {})
        self._check()

    def _check(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"tensors disagree on the batch size: {sizes}")
        n = len(self)
        for key, value in self.metadata.items():
            if isinstance(value, list) and self.tensors and len(value) != n:
                raise ValueError(
                    f"metadata[{key!r}] is a per-row list of length {len(value)}, batch has {n} rows"
                )

    # ---- access ---------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return v.shape[0]
        for v in self.metadata.values():
            if isinstance(v, list):
                return len(v)
        return 0

    def keys(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def require(self, key: str) -> torch.Tensor:
        """The field ``key``; a ``KeyError`` naming it (and the fields present) if absent."""
        if key not in self.tensors:
            raise KeyError(f"batch has no {key!r} (fields: {', '.join(self.tensors)})")
        return self.tensors[key]

    def get(self, key: str, default: torch.Tensor | None = None) -> torch.Tensor | None:
        return self.tensors.get(key, default)

    # The three fields every batch carries are typed as present; a missing one is a KeyError.
    @property
    def input_ids(self) -> torch.Tensor:
        return self.tensors["input_ids"]

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.tensors["attention_mask"]

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.tensors["loss_mask"]

    def __getattr__(self, name: str) -> torch.Tensor | None:
        """Any other field by name; a known optional field that is absent is None."""
        if name.startswith("__") or name in ("tensors", "metadata"):
            raise AttributeError(name)
        tensors = self.__dict__.get("tensors", {})
        if name in tensors:
            return tensors[name]
        if name in KNOWN_FIELDS:
            return None
        raise AttributeError(f"TrainingInputBatch has no field {name!r}")

    def __getitem__(self, key: str | RowIndex):
        if isinstance(key, str):
            if key in self.tensors:
                return self.tensors[key]
            if key in KNOWN_FIELDS:
                return None
            raise KeyError(key)
        return self.select_rows(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={tuple(v.shape)}:{v.dtype}" for k, v in self.tensors.items())
        return f"TrainingInputBatch(len={len(self)}, {fields}, metadata={sorted(self.metadata)})"

    # ---- new batches ----------------------------------------------------------
    def select_rows(self, index: RowIndex) -> TrainingInputBatch:
        """Rows by int, slice, index list/array/tensor (in the given order; negative rows
        count from the end), or boolean mask of ``len(self)`` (the rows it marks). A row out
        of range is an ``IndexError``; a float index a ``TypeError``."""
        n = len(self)
        if isinstance(index, int):
            _check_rows_in_range(np.asarray([index]), n)
            index = slice(index, index + 1 if index != -1 else None)
        if isinstance(index, slice):
            tensors = {k: v[index] for k, v in self.tensors.items()}
            metadata = {
                k: (v[index] if isinstance(v, list) else v) for k, v in self.metadata.items()
            }
            return TrainingInputBatch(tensors, metadata)
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        rows = np.asarray(index).reshape(-1)
        if rows.dtype == np.bool_:
            if len(rows) != n:
                raise ValueError(f"mask of {len(rows)} rows for a batch of {n}")
            rows = np.flatnonzero(rows)
        elif rows.size and rows.dtype.kind not in "iu":
            raise TypeError(f"row index must be integers or a boolean mask, got {rows.dtype}")
        rows = rows.astype(np.int64)
        _check_rows_in_range(rows, n)
        idx = torch.as_tensor(np.where(rows < 0, rows + n, rows))
        idx_list = idx.tolist()
        tensors = {k: v.index_select(0, idx.to(v.device)) for k, v in self.tensors.items()}
        metadata = {
            k: ([v[i] for i in idx_list] if isinstance(v, list) else v)
            for k, v in self.metadata.items()
        }
        return TrainingInputBatch(tensors, metadata)

    def chunk(self, num_chunks: int) -> list[TrainingInputBatch]:
        """Split into ``num_chunks`` contiguous batches of equal size (must divide)."""
        if num_chunks < 1 or len(self) % num_chunks:
            raise ValueError(f"cannot split {len(self)} rows into {num_chunks} equal chunks")
        size = len(self) // num_chunks
        return [self[i * size : (i + 1) * size] for i in range(num_chunks)]

    @staticmethod
    def cat(batches: Sequence[TrainingInputBatch]) -> TrainingInputBatch:
        """Concatenate rows, fields in the first batch's order. Every batch must hold the same
        fields (in any order) with the same row shape, and the same per-row metadata lists;
        batch-level metadata comes from the first."""
        if not batches:
            raise ValueError("cannot concatenate zero batches")
        keys = batches[0].keys()
        for i, b in enumerate(batches[1:], start=1):
            missing, extra = sorted(set(keys) - set(b.keys())), sorted(set(b.keys()) - set(keys))
            if missing or extra:
                raise ValueError(
                    f"batch {i} differs from batch 0 in its fields: missing {missing}, extra {extra}"
                )
            for k in keys:
                row, other = tuple(batches[0].tensors[k].shape[1:]), tuple(b.tensors[k].shape[1:])
                if row != other:
                    raise ValueError(
                        f"field {k!r} has rows of shape {row} in batch 0 but {other} in batch {i}"
                    )
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in keys}
        row_keys = {k for b in batches for k, v in b.metadata.items() if isinstance(v, list)}
        for k in sorted(row_keys):
            if not all(isinstance(b.metadata.get(k), list) for b in batches):
                raise ValueError(f"per-row metadata {k!r} is missing in some batches")
        metadata = {
            k: [x for b in batches for x in b.metadata[k]] if k in row_keys else v
            for k, v in batches[0].metadata.items()
        }
        return TrainingInputBatch(tensors, metadata)

    def select(self, keys: Sequence[str], metadata_keys: Sequence[str] | None = None):
        """A batch with only ``keys`` (absent known fields are skipped) and, if
        given, only ``metadata_keys``."""
        tensors = {k: self.tensors[k] for k in keys if k in self.tensors}
        meta = (
            self.metadata if metadata_keys is None else {k: self.metadata[k] for k in metadata_keys}
        )
        return TrainingInputBatch(tensors, copy.copy(meta))

    def replace(self, **tensors: torch.Tensor | None) -> TrainingInputBatch:
        """A new batch with some fields set (None removes one); metadata copied."""
        new: dict[str, torch.Tensor | None] = {**self.tensors, **tensors}
        return TrainingInputBatch(new, copy.copy(self.metadata))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TrainingInputBatch:
        tensors = {k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()}
        return TrainingInputBatch(tensors, self.metadata)

    def real_lengths(self) -> torch.Tensor:
        """Tokens per row, ``attention_mask.sum(1)`` (long ``[B]``)."""
        return self.tensors["attention_mask"].sum(dim=1, dtype=torch.long)

    # ---- pickling for Ray -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # A slice is a view of the whole parent storage, and torch pickles the
        # whole storage: copy views so a chunk ships only its own rows.
        tensors = {}
        for k, v in self.tensors.items():
            if v.untyped_storage().nbytes() > v.numel() * v.element_size() or not v.is_contiguous():
                v = v.contiguous().clone()
            tensors[k] = v
        return {"tensors": tensors, "metadata": self.metadata}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _check_rows_in_range(rows: np.ndarray, num_rows: int) -> None:
    """An ``IndexError`` naming the first of ``rows`` outside ``[-num_rows, num_rows)``."""
    outside = (rows < -num_rows) | (rows >= num_rows)
    if outside.any():
        row = int(rows[np.argmax(outside)])
        raise IndexError(f"row {row} is out of range for a batch of {num_rows} rows")


def pad_training_input_batch(batch: TrainingInputBatch, pad_size: int) -> TrainingInputBatch:
    """A NEW batch with ``pad_size`` extra rows built from row 0, contributing no loss.

    Padding rows: row 0's first token alone (token-level fields hold row 0's column 0 and
    zeros after it; no token where row 0 has none), so a rank given one computes one token
    for it, not a whole sequence; row-level fields copy row 0; ``loss_mask`` (and
    ``loss_weights``) all zero, ``uids``
    ``pad0, pad1, ...``, ``is_last_step`` True, ``trajectory_ids`` like uids,
    ``is_padding`` True (real rows False); other per-row metadata copies row 0.
    ``metadata["pad_size"] = pad_size``. ``pad_size == 0`` returns ``batch``
    itself, untouched. The input is never mutated.
    """
    if pad_size < 0:
        raise ValueError(f"pad_size must be >= 0, got {pad_size}")
    if pad_size == 0:
        return batch
    if len(batch) == 0:
        raise ValueError("cannot pad an empty batch: there is no row 0 to copy")
    zero_fields = ("loss_mask", "loss_weights")
    seq_len = batch.input_ids.shape[1]
    tensors = {}
    for k, v in batch.tensors.items():
        pad = v[:1].expand(pad_size, *v.shape[1:])
        if v.dim() >= 2 and v.shape[1] == seq_len:  # token-level, right-padded
            pad = torch.zeros_like(pad)
            if k not in zero_fields:
                pad[:, :1] = v[:1, :1]  # row 0's first token
        tensors[k] = torch.cat([v, pad])
    n = len(batch)
    pad_names = [f"pad{i}" for i in range(pad_size)]
    metadata: dict[str, Any] = {}
    for k, v in batch.metadata.items():
        if not isinstance(v, list):
            metadata[k] = v
        elif k in ("uids", "trajectory_ids"):
            metadata[k] = v + pad_names
        elif k == "is_last_step":
            metadata[k] = v + [True] * pad_size
        elif k == "is_padding":
            metadata[k] = v + [True] * pad_size
        else:
            metadata[k] = v + [v[0]] * pad_size
    metadata.setdefault("is_padding", [False] * n + [True] * pad_size)
    metadata["pad_size"] = pad_size
    return TrainingInputBatch(tensors, metadata)
