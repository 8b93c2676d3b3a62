"""Token-budget micro batches (``trainer.micro_batch_max_tokens``).

A worker's chunk is split into micro batches whose token sum stays under a
cap, and each micro batch is PACKED, not padded: its sequences' real tokens
are concatenated in one row ``[1, T]`` with position ids restarting at 0 per
sequence, so attention stays inside each sequence (transformers detects the
restarts when ``attention_mask`` is None; flash-attention uses varlen).

All DP ranks must run the same number of micro batches per mini-batch
(DeepSpeed hangs or leaks gradients otherwise): the worker plans its own count,
all-reduces MAX, and pads its micro batches to that count (``pad_micro_batches``); the
extra micro batches are empty (one dummy token, zero loss).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from skyrl.batch.training_batch import TrainingInputBatch

_BIN_BITS = 32
_BIN_MASK = (1 << _BIN_BITS) - 1


def pack_micro_batches(lengths: Sequence[int] | np.ndarray, max_tokens: int) -> list[list[int]]:
    """Group row indices into micro batches whose token sum is ``<= max_tokens``.

    Best-fit decreasing (as good as first-fit decreasing or better in
    practice), run over RUNS of equal lengths rather than single sequences
    (``_best_fit_runs``): the Python loop grows with the number of distinct
    lengths (at most ``max_tokens``), not with the number of sequences, and
    opens exactly as many micro batches as per-sequence best fit. A sequence
    longer than ``max_tokens`` sits alone. Deterministic: ties keep input
    order; indices inside a micro batch are ascending and micro batches are
    ordered by their first index.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    n = len(lengths)
    if n == 0:
        return []
    if (lengths < 0).any():
        raise ValueError("lengths must be >= 0")
    order = _stable_argsort(-lengths)
    sorted_lengths = lengths[order]
    run_starts = np.flatnonzero(sorted_lengths[1:] != sorted_lengths[:-1]) + 1
    values = sorted_lengths[np.concatenate([[0], run_starts])].tolist()
    counts = np.diff(np.concatenate([[0], run_starts, [n]])).tolist()
    seg_bins, seg_counts = _best_fit_runs(values, counts, max_tokens)
    bins_of_rows = np.empty(n, dtype=np.int64)
    bins_of_rows[order] = np.repeat(np.asarray(seg_bins, dtype=np.int64), seg_counts)
    row_order = _stable_argsort(bins_of_rows)
    grouped = bins_of_rows[row_order]
    edges = [0, *(np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist(), n]
    flat = row_order.tolist()
    groups = [flat[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]
    groups.sort(key=lambda g: g[0])
    return groups


def _stable_argsort(keys: np.ndarray) -> np.ndarray:
    """Stable argsort; int16 keys when they fit (numpy radix-sorts them: ~10x faster)."""
    if len(keys) and -(2**15) <= keys.min() and keys.max() < 2**15:
        keys = keys.astype(np.int16)
    return np.argsort(keys, kind="stable")


def _best_fit_runs(
    values: list[int], counts: list[int], max_tokens: int
) -> tuple[list[int], list[int]]:
    """Best fit over runs of equal lengths: ``counts[i]`` sequences of length
    ``values[i]``, values strictly decreasing. Returns segments ``(bin, k)``
    in sorted order: the next ``k`` sequences go to ``bin``.

    Open bins are grouped by remaining tokens (bins with equal room are
    interchangeable). Best fit puts a sequence of length L in a bin of the
    smallest room r >= L; that bin then has r - L, and if that is still >= L it
    is again the smallest room >= L. So within a run each bin of room r takes
    ``r // L`` sequences in a row before the next room class is used, and
    new bins take ``max_tokens // L`` each: a whole room class per step.
    """
    min_length = values[-1]
    buckets: dict[int, list[int]] = {}  # room -> open bins with that room
    rooms: list[int] = []  # sorted keys of ``buckets``
    seg_bins: list[int] = []
    seg_counts: list[int] = []
    num_bins = 0
    find = bisect.bisect_left

    def add(room: int, bins: list[int]) -> None:
        if room < min_length or room <= 0:  # no sequence left can join
            return
        bucket = buckets.get(room)
        if bucket is None:
            buckets[room] = bins
            rooms.insert(find(rooms, room), room)
        else:
            bucket.extend(bins)

    for length, k in zip(values, counts, strict=True):
        if length > max_tokens:  # alone, closed
            seg_bins.extend(range(num_bins, num_bins + k))
            seg_counts += [1] * k
            num_bins += k
            continue
        if length == 0:  # the last run: all in the fullest open bin
            if rooms:
                seg_bins.append(buckets[rooms[0]][-1])
            else:
                seg_bins.append(num_bins)
                num_bins += 1
            seg_counts.append(k)
            continue
        j = find(rooms, length)
        while k and j < len(rooms):
            room = rooms[j]
            bucket = buckets[room]
            per_bin = room // length
            num = len(bucket)
            left = room - per_bin * length  # < length: out of this run
            if k >= num * per_bin:  # the whole room class fills up
                del buckets[room], rooms[j]
                seg_bins += bucket
                seg_counts += [per_bin] * num
                k -= num * per_bin
                add(left, bucket)
                j = find(rooms, length)
                continue
            full, rest = divmod(k, per_bin)
            k = 0
            taken = bucket[num - full :]
            del bucket[num - full :]
            seg_bins += taken
            seg_counts += [per_bin] * full
            if rest:
                last = bucket.pop()
                seg_bins.append(last)
                seg_counts.append(rest)
            if not bucket:
                del buckets[room], rooms[j]
            if rest:
                add(room - rest * length, [last])  # still >= length
            if full:
                add(left, taken)
        if k:  # new bins
            per_bin = max_tokens // length
            full, rest = divmod(k, per_bin)
            if full:
                new = list(range(num_bins, num_bins + full))
                num_bins += full
                seg_bins += new
                seg_counts += [per_bin] * full
                add(max_tokens - per_bin * length, new)
            if rest:
                seg_bins.append(num_bins)
                seg_counts.append(rest)
                add(max_tokens - rest * length, [num_bins])
                num_bins += 1
    return seg_bins, seg_counts


def _best_fit_sorted_list(sorted_lengths: list[int], max_tokens: int) -> list[int]:
    """Reference per-sequence best fit (tests check ``_best_fit_runs`` against it):
    Best fit over lengths sorted longest first; open bins kept as one sorted
    list of ``remaining << 32 | bin``: cost grows with the number of bins."""
    min_length = sorted_lengths[-1]
    open_bins: list[int] = []
    assignment: list[int] = []
    num_bins = 0
    find, insert, pop, assign = (
        bisect.bisect_left,
        open_bins.insert,
        open_bins.pop,
        assignment.append,
    )
    for length in sorted_lengths:
        j = find(open_bins, length << _BIN_BITS)
        if j == len(open_bins):
            b, remaining = num_bins, max_tokens - length
            num_bins += 1
        else:
            key = pop(j)
            b, remaining = key & _BIN_MASK, (key >> _BIN_BITS) - length
        assign(b)
        if remaining >= min_length and remaining > 0:  # else no item can join it
            key = (remaining << _BIN_BITS) | b
            insert(find(open_bins, key), key)
    return assignment


def _best_fit_bitset(sorted_lengths: list[int], max_tokens: int) -> list[int]:
    """Reference per-sequence best fit (tests check ``_best_fit_runs`` against it):
    same best fit, open bins bucketed by remaining tokens with a Python-int
    bitset of non-empty buckets: cost grows with ``max_tokens``, not bins."""
    min_length = sorted_lengths[-1]
    buckets: list[list[int]] = [[] for _ in range(max_tokens + 1)]
    nonempty = 0
    assignment: list[int] = []
    assign = assignment.append
    num_bins = 0
    for length in sorted_lengths:
        above = nonempty >> length if length <= max_tokens else 0
        if above:
            remaining = length + (above & -above).bit_length() - 1
            bucket = buckets[remaining]
            b = bucket.pop()
            if not bucket:
                nonempty ^= 1 << remaining
            remaining -= length
        else:
            b, remaining = num_bins, max_tokens - length
            num_bins += 1
        assign(b)
        if remaining >= min_length and remaining > 0:
            bucket = buckets[remaining]
            if not bucket:
                nonempty |= 1 << remaining
            bucket.append(b)
    return assignment


@dataclass
class PackedMicroBatch:
    """One packed micro batch from rows of a chunk.

    - ``input_ids``, ``position_ids``: ``[1, T]``; positions restart at 0 per sequence. A
      prompt that several rows share is packed once (``plan_micro_batches(share_prefixes=
      True)``): its rows' continuations follow it, each with positions that go on from the
      prompt's length (a jump back marks the next one; ``skyrl.workers.packed_attention``
      lets each attend to the shared prompt and to itself only).
    - ``parents``: long ``[T]``, the packed position whose output predicts the token at each
      position (the previous token of its sequence: the shared prompt's last one for a
      continuation's first token), -1 where a sequence starts.
    - ``token_index``: long ``[sum(seq_lens)]``, for every real token of the rows in
      ``row_indices`` order, its packed position (``unpack`` gathers through it).
    - ``row_indices``: the chunk rows packed here; ``seq_lens``: their lengths.
    - ``token_fields``: other token-level fields packed to ``[1, T]`` (``loss_mask``,
      ``advantages``, ``old_logprobs``, ``loss_weights``, ...; a shared prompt's values from
      its first row: a shared prompt holds no loss token); ``row_fields``: per-row fields
      ``[n]`` (``rewards``).
    - ``sample_count``: real (non-padding) rows with at least one token (a row of none, from
      an env that failed before its first turn, computes nothing); 0 for an empty filler.
    - ``padding_rows``: per row of ``row_indices``, whether it is a data-parallel padding row
      (a zero-loss copy: computed, but no data).
    - ``token_masks``: per row the boolean ``[S]`` mask of its real tokens (for unpack).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    parents: torch.Tensor
    token_index: torch.Tensor
    row_indices: list[int]
    seq_lens: list[int]
    token_fields: dict[str, torch.Tensor]
    row_fields: dict[str, torch.Tensor]
    sample_count: int
    seq_len: int
    token_masks: torch.Tensor = field(repr=False)
    padding_rows: list[bool] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens the model computes: the packed row's length (a shared prompt counted once;
        0 for an empty filler micro batch)."""
        return 0 if self.is_empty else int(self.input_ids.shape[1])

    @property
    def sequence_tokens(self) -> int:
        """Real tokens of the rows, a shared prompt counted once per row."""
        return sum(self.seq_lens)

    @property
    def padding_tokens(self) -> int:
        """Tokens of padding rows (never sharing a prompt: each has a uid of its own)."""
        return sum(n for n, pad in zip(self.seq_lens, self.padding_rows, strict=False) if pad)

    @property
    def is_empty(self) -> bool:
        return not self.row_indices

    def __getitem__(self, key: str) -> torch.Tensor | None:
        if key == "input_ids":
            return self.input_ids
        if key == "position_ids":
            return self.position_ids
        return self.token_fields.get(key, self.row_fields.get(key))

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """Scatter per-token values ``[1, T]`` (or ``[T]``) back to ``[n, S]``
        (zeros at padding), rows in ``row_indices`` order; a shared prompt's values go to
        each of its rows. Differentiable (gradients of a shared position add up)."""
        values = packed.reshape(-1)
        out = values.new_zeros(len(self.row_indices), self.seq_len)
        if self.row_indices:
            index = self.token_index.to(values.device)
            out[self.token_masks.to(values.device)] = values.index_select(0, index)
        return out


def shared_prefix_units(chunk: TrainingInputBatch, max_tokens: int) -> list[tuple[list[int], int]]:
    """The chunk's rows as packing units ``(rows, shared prefix length)``: rows whose tokens
    before their first loss token are the same (the samples of one prompt, say) form one
    unit that packs that prompt once, split where the unit would exceed ``max_tokens``; every
    other row is a unit of its own with prefix 0, and so is every data-parallel padding row
    (row 0's first token with no loss token: counted as padding, not shared). A
    shared prefix holds no loss token and leaves every row at least one token of its own."""
    real_lengths = chunk.real_lengths()
    lengths = real_lengths.tolist()
    loss_mask = chunk["loss_mask"]
    if loss_mask is None:
        return [([row], 0) for row in range(len(lengths))]
    is_padding = chunk.metadata.get("is_padding") or [False] * len(lengths)
    has_loss = loss_mask.ne(0)
    first_loss = torch.where(has_loss.any(1), has_loss.long().argmax(1), real_lengths)
    ids = chunk.input_ids.numpy()
    groups: dict[bytes, list[int]] = {}
    units: list[tuple[list[int], int]] = []
    for row, (length, first) in enumerate(zip(lengths, first_loss.tolist(), strict=True)):
        prefix = min(first, length - 1)
        if prefix < 1 or is_padding[row]:
            units.append(([row], 0))
            continue
        key = ids[row, :prefix].tobytes()
        if key not in groups:
            groups[key] = []
            units.append((groups[key], prefix))
        groups[key].append(row)
    packed: list[tuple[list[int], int]] = []
    for rows, prefix in units:
        cost = 0
        for row in rows:
            own = lengths[row] - prefix
            if cost and cost + own <= max_tokens:
                packed[-1][0].append(row)
                cost += own
            else:
                packed.append(([row], prefix))
                cost = prefix + own
    return [(rows, prefix if len(rows) > 1 else 0) for rows, prefix in packed]


def _unit_cost(lengths: list[int], rows: list[int], prefix: int) -> int:
    return prefix + sum(lengths[row] - prefix for row in rows)


def _pack_units(
    chunk: TrainingInputBatch, units: list[tuple[list[int], int]], is_padding: list[bool]
) -> PackedMicroBatch:
    """One micro batch of whole units: a unit's shared prefix once, then each row's own
    tokens; every other row whole."""
    rows = [row for unit_rows, _ in units for row in unit_rows]
    idx = torch.as_tensor(rows, dtype=torch.long)
    attention = chunk.attention_mask.index_select(0, idx).bool()
    seq_lens = attention.sum(1).tolist()
    length_of = dict(zip(rows, seq_lens, strict=True))
    # per packed position: the (row, column) it is taken from and its parent; per row token:
    # its packed position. One tensor per segment, so the work grows with rows, not tokens.
    src_rows: list[torch.Tensor] = []
    src_cols: list[torch.Tensor] = []
    parents: list[torch.Tensor] = []
    token_index: list[torch.Tensor] = []
    offset = 0

    def segment(row: int, first: int, count: int, first_parent: int) -> None:
        nonlocal offset
        if count:
            src_rows.append(torch.full((count,), row, dtype=torch.long))
            src_cols.append(torch.arange(first, first + count))
            parent = torch.arange(offset - 1, offset + count - 1)
            parent[0] = first_parent
            parents.append(parent)
            offset += count

    for unit_rows, prefix in units:
        base = offset
        segment(unit_rows[0], 0, prefix, -1)  # the shared prefix, from the unit's first row
        for row in unit_rows:
            own = length_of[row] - prefix
            token_index += [torch.arange(base, base + prefix), torch.arange(offset, offset + own)]
            segment(row, prefix, own, base + prefix - 1 if prefix else -1)
    empty = torch.zeros(0, dtype=torch.long)
    src_r, src_c = torch.cat([empty, *src_rows]), torch.cat([empty, *src_cols])
    token_fields, row_fields = {}, {}
    for key, value in chunk.tensors.items():
        if key in ("input_ids", "attention_mask"):
            continue
        if value.dim() >= 2 and value.shape[1] == attention.shape[1]:
            token_fields[key] = value[src_r, src_c].unsqueeze(0)
        else:
            row_fields[key] = value.index_select(0, idx)
    return PackedMicroBatch(
        input_ids=chunk.input_ids[src_r, src_c].unsqueeze(0),
        position_ids=src_c.unsqueeze(0),
        parents=torch.cat([empty, *parents]),
        token_index=torch.cat([empty, *token_index]),
        row_indices=rows,
        seq_lens=seq_lens,
        token_fields=token_fields,
        row_fields=row_fields,
        sample_count=sum(not is_padding[r] and length_of[r] > 0 for r in rows),
        seq_len=attention.shape[1],
        token_masks=attention,
        padding_rows=[bool(is_padding[r]) for r in rows],
    )


def _empty_micro_batch(chunk: TrainingInputBatch) -> PackedMicroBatch:
    """One dummy token with zero loss: lets a rank match the others' micro-batch count."""
    token = chunk.input_ids[:1, :1].clone() if len(chunk) else torch.zeros(1, 1, dtype=torch.long)
    token_fields = {
        k: torch.zeros(1, 1, dtype=v.dtype)
        for k, v in chunk.tensors.items()
        if k not in ("input_ids", "attention_mask") and v.dim() >= 2
    }
    return PackedMicroBatch(
        input_ids=token,
        position_ids=torch.zeros(1, 1, dtype=torch.long),
        parents=torch.full((1,), -1, dtype=torch.long),
        token_index=torch.zeros(0, dtype=torch.long),
        row_indices=[],
        seq_lens=[],
        token_fields=token_fields,
        row_fields={},
        sample_count=0,
        seq_len=chunk.input_ids.shape[1] if len(chunk) else 0,
        token_masks=torch.zeros(0, 0, dtype=torch.bool),
    )


def plan_micro_batches(
    chunk: TrainingInputBatch,
    max_tokens: int,
    num_micro_batches: int | None = None,
    share_prefixes: bool = False,
) -> list[PackedMicroBatch]:
    """Pack one rank's chunk into micro batches of at most ``max_tokens`` tokens.

    With ``share_prefixes``, rows with the same prompt (``shared_prefix_units``) are packed
    together with the prompt once, and the budget counts it once. With ``num_micro_batches``
    (the MAX over DP ranks), appends empty zero-loss micro batches up to that count; fewer
    than this rank needs is an error. Empty filler micro batches have ``is_empty`` True,
    ``sample_count`` 0 and ``num_tokens`` 0 (their one dummy token has ``loss_mask`` 0).
    """
    lengths = chunk.real_lengths().tolist()
    if share_prefixes:
        units = shared_prefix_units(chunk, max_tokens)
    else:
        units = [([row], 0) for row in range(len(lengths))]
    costs = [_unit_cost(lengths, rows, prefix) for rows, prefix in units]
    groups = _group_units(costs, max_tokens)
    is_padding = chunk.metadata.get("is_padding") or [False] * len(chunk)
    micro = [  # a chunk of rows of no tokens only (envs that failed at init): a filler
        _pack_units(chunk, [units[u] for u in g], is_padding)
        if any(costs[u] for u in g)
        else _empty_micro_batch(chunk)
        for g in groups
    ]
    if num_micro_batches is None:
        return micro
    return pad_micro_batches(micro, chunk, num_micro_batches)


def _group_units(costs: list[int], max_tokens: int) -> list[list[int]]:
    """``pack_micro_batches`` of the units that have tokens; units of none (rows of an env
    that failed before its first turn) cost nothing and join the lightest micro batch, so
    they never open one of their own (a filler every rank would run). Only a chunk of such
    rows alone gives one group of them (a filler)."""
    sized = [u for u, cost in enumerate(costs) if cost]
    groups = [
        [sized[i] for i in g] for g in pack_micro_batches([costs[u] for u in sized], max_tokens)
    ]
    empty = [u for u, cost in enumerate(costs) if not cost]
    if not empty:
        return groups
    if not groups:
        return [empty]
    lightest = min(range(len(groups)), key=lambda g: sum(costs[u] for u in groups[g]))
    groups[lightest] = sorted(groups[lightest] + empty)
    return groups


def pad_micro_batches(
    micro: list[PackedMicroBatch], chunk: TrainingInputBatch, num_micro_batches: int
) -> list[PackedMicroBatch]:
    """``micro`` (a plan of ``chunk``) followed by empty zero-loss micro batches up to
    ``num_micro_batches``, the MAX over DP ranks; a count below the plan's is an error."""
    if num_micro_batches < len(micro):
        raise ValueError(
            f"num_micro_batches={num_micro_batches} is below the {len(micro)} this chunk "
            "needs; pass the MAX over ranks"
        )
    return [*micro, *(_empty_micro_batch(chunk) for _ in range(num_micro_batches - len(micro)))]


def unpack_to_rows(
    micro_batches: Sequence[PackedMicroBatch], packed_values: Sequence[torch.Tensor], num_rows: int
) -> torch.Tensor:
    """Scatter per-token results of all micro batches back to ``[num_rows, S]``
    in the chunk's original row order (zeros at padding, and for rows no micro batch holds:
    rows of no tokens)."""
    if not micro_batches:
        raise ValueError("no micro batch to unpack")
    real = [(mb, v) for mb, v in zip(micro_batches, packed_values, strict=True) if not mb.is_empty]
    out = packed_values[0].new_zeros(num_rows, micro_batches[0].seq_len)
    for mb, values in real:
        out[torch.as_tensor(mb.row_indices, dtype=torch.long)] = mb.unpack(values)
    return out


def micro_batch_metrics(
    micro_batches: Sequence[PackedMicroBatch],
    max_tokens: int,
    rank_token_imbalance: float | None = None,
) -> dict[str, float]:
    """Step metrics of one rank's micro batches (sum them over mini-batches/ranks
    as needed; throughput should use ``local_tokens``, the real packed tokens, which count a
    shared prompt once; ``shared_prefix_tokens`` is what sharing saved; ``padding_tokens``
    what data-parallel padding rows cost on top).

    ``fill_ratio`` = real tokens / ``capacity_tokens``, each micro batch's capacity the cap, or
    its tokens when a sequence longer than the cap sits in it alone (so the ratio is at most 1).
    """
    padding = sum(mb.padding_tokens for mb in micro_batches)
    tokens = [mb.num_tokens for mb in micro_batches]
    real = sum(tokens) - padding
    capacity = sum(max(n, max_tokens) for n in tokens)
    loss_tokens = sum(
        float(mb.token_fields["loss_mask"].sum())
        for mb in micro_batches
        if "loss_mask" in mb.token_fields and not mb.is_empty
    )
    data_lens = [
        n
        for mb in micro_batches
        for n, pad in zip(mb.seq_lens, mb.padding_rows or [False] * len(mb.seq_lens), strict=True)
        if not pad
    ]
    metrics = {
        "local_tokens": float(real),
        "local_loss_tokens": loss_tokens,
        "local_samples": float(sum(mb.sample_count for mb in micro_batches)),
        "local_micro_batches": float(len(micro_batches)),
        "max_micro_batch_tokens": float(max(tokens, default=0)),
        "micro_batch_max_tokens": float(max_tokens),
        "fill_ratio": real / capacity if capacity else 0.0,
        "oversized_sequences": float(sum(n > max_tokens for n in data_lens)),
        "shared_prefix_tokens": float(
            sum(mb.sequence_tokens - mb.num_tokens for mb in micro_batches)
        ),
        "padding_tokens": float(padding),
        "capacity_tokens": float(capacity),
    }
    if rank_token_imbalance is not None:
        metrics["rank_token_imbalance"] = float(rank_token_imbalance)
    return metrics
