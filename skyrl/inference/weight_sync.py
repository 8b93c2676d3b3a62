"""Weight sync over a broadcast group: policy rank 0 sends, every engine receives.

The object-store path (``WorkerGroup.stream_weight_buckets``) pickles each bucket
through Ray. This path instead opens one torch.distributed group of its own
between policy rank 0 (group rank 0) and the engines' model processes (ranks
1..N) and broadcasts each bucket as one flat byte buffer: NCCL on GPUs (device to
device, nothing pickled), gloo on CPUs. The group is separate from DeepSpeed's
training group, built on its own TCPStore hosted by policy rank 0.

Both ends agree on a *plan* made once, before the first sync: the buckets, and
for each tensor its name, shape and dtype, as plain lists so it can cross any
RPC (vLLM's ``collective_rpc`` included). Each entry starts on a 16-byte
boundary of its bucket so receivers can view it as its dtype without a copy.

NCCL cannot join two ranks on one GPU, so with NCCL the engines must run on
GPUs other than policy rank 0's (``generator.num_gpus_per_engine``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

TensorSpec = tuple[str, list[int], str]
"""``(name, shape, dtype name)`` of one tensor, e.g. ``("lm_head.weight", [64, 512], "float32")``."""
Plan = list[list[TensorSpec]]
"""Buckets of tensor specs, in the order the sender produces the tensors."""
ALIGN_BYTES = 16
"""Every tensor starts at a multiple of this offset inside its bucket buffer."""


def tensor_spec(name: str, shape: Iterable[int], dtype: torch.dtype) -> TensorSpec:
    return (name, [int(s) for s in shape], str(dtype).removeprefix("torch."))


def _dtype(spec: TensorSpec) -> torch.dtype:
    return getattr(torch, spec[2])


def spec_nbytes(spec: TensorSpec) -> int:
    """Bytes of the tensor ``spec`` describes."""
    numel = 1
    for s in spec[1]:
        numel *= s
    return numel * _dtype(spec).itemsize


def bucket_offsets(bucket: list[TensorSpec]) -> tuple[list[int], int]:
    """Start offset of each tensor and the bucket's total size, in bytes."""
    offsets, pos = [], 0
    for spec in bucket:
        offsets.append(pos)
        pos += -(-spec_nbytes(spec) // ALIGN_BYTES) * ALIGN_BYTES
    return offsets, pos


def plan_buckets(specs: Iterable[TensorSpec], bucket_bytes: int) -> Plan:
    """Consecutive specs grouped into buckets of about ``bucket_bytes`` (a tensor larger than
    that gets a bucket of its own)."""
    plan: Plan = [[]]
    size = 0
    for spec in specs:
        if plan[-1] and size + spec_nbytes(spec) > bucket_bytes:
            plan.append([])
            size = 0
        plan[-1].append(spec)
        size += spec_nbytes(spec)
    return [bucket for bucket in plan if bucket]


def join_group(
    host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float = 600.0
):
    """This process's handle on the sync group; rank 0 hosts the TCPStore. Every rank must
    call this at about the same time (it returns once all have joined, gloo, or at the first
    collective, NCCL)."""
    timeout = timedelta(seconds=timeout_s)
    tcp_store = dist.TCPStore(
        host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    store = dist.PrefixStore("skyrl-weight-sync", tcp_store)
    if backend == "nccl":
        # Options() is the binding's default; torch's stub marks the argument required.
        return dist.ProcessGroupNCCL(store, rank, world_size, dist.ProcessGroupNCCL.Options())
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    raise ValueError(f"weight sync backend must be 'nccl' or 'gloo', got {backend!r}")


def _broadcast(group, buffer: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([buffer], opts).wait()


def send_bucket(group, bucket: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
    """Rank 0: broadcast ``tensors`` (matching ``bucket``) as one flat buffer."""
    offsets, total = bucket_offsets(bucket)
    device = tensors[0].device if tensors else torch.device("cpu")
    buffer = torch.empty(total, dtype=torch.uint8, device=device)
    for spec, offset, tensor in zip(bucket, offsets, tensors, strict=True):
        if list(tensor.shape) != spec[1] or tensor.dtype != _dtype(spec):
            raise ValueError(
                f"weight sync: {spec[0]} is {list(tensor.shape)} {tensor.dtype}, "
                f"the plan says {spec[1]} {spec[2]}"
            )
        flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
        buffer[offset : offset + flat.numel()].copy_(flat)
    _broadcast(group, buffer)


def receive_bucket(group, bucket: list[TensorSpec], device) -> list[tuple[str, torch.Tensor]]:
    """Ranks > 0: the named tensors of one broadcast bucket (views of one fresh buffer)."""
    offsets, total = bucket_offsets(bucket)
    buffer = torch.empty(total, dtype=torch.uint8, device=device)
    _broadcast(group, buffer)
    named = []
    for spec, offset in zip(bucket, offsets, strict=True):
        raw = buffer[offset : offset + spec_nbytes(spec)]
        named.append((spec[0], raw.view(_dtype(spec)).view(spec[1])))
    return named


def receive_stream(group, plan: Plan, device) -> Iterator[tuple[str, torch.Tensor]]:
    """All named tensors of ``plan``, received one bucket at a time as they are consumed."""
    for bucket in plan:
        yield from receive_bucket(group, bucket, device)
