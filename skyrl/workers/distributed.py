"""torch.distributed / DeepSpeed set-up inside one worker process.

Each DeepSpeed worker is a Ray actor; before DeepSpeed is imported it needs
the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...), otherwise
DeepSpeed looks for MPI. On CPU machines the accelerator is forced to ``cpu``,
the backend is gloo, and DeepSpeed's shared-memory comm op (a ~3 minute
compile on first use) is skipped. See shared/NOTES-cpu.md.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from datetime import timedelta
from typing import Any

import torch

FIRST_PORT = 20000
"""Lowest port ``find_free_port`` picks: above Ray's worker ports (10002-19999 by default)."""


def find_free_port() -> int:
    """A TCP port free on this host right now, for a TCPStore another process binds later.

    A port the kernel hands out for ``bind(0)`` lies in its ephemeral range, which every
    outgoing connection also draws from: in the seconds until a worker binds it, Ray's own
    connections can take it (EADDRINUSE, seen in CI). So the port is drawn at random between
    ``FIRST_PORT`` and the start of that range, where only explicit binds land, and checked
    by binding it. The draw uses the OS's randomness: workers seed ``random`` alike."""
    low, _ = _ephemeral_range()
    for _ in range(64):
        if low <= FIRST_PORT:
            break
        port = FIRST_PORT + secrets.randbelow(low - FIRST_PORT)
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def address_in_use(exc: BaseException) -> bool:
    """The error of a TCPStore that could not bind its port (another process took it)."""
    return "EADDRINUSE" in str(exc) or "address already in use" in str(exc).lower()


def node_ip() -> str:
    """This host's address for MASTER_ADDR (loopback on a single machine)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


def set_dist_env(
    rank: int, world_size: int, master_addr: str, master_port: int, timeout_min: int
) -> None:
    """The environment a torchrun/deepspeed launcher would have set."""
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": "0" if torch.cuda.is_available() else str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "DEEPSPEED_TIMEOUT": str(timeout_min),
        }
    )
    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def init_distributed(timeout_min: int) -> None:
    """Initialise DeepSpeed's process group: nccl with CUDA, gloo without."""
    import deepspeed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        # Importing deepspeed.comm.torch by name gives the real torch module (a name
        # clash), so patch through sys.modules.
        ds_torch: Any = sys.modules["deepspeed.comm.torch"]
        ds_torch.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(minutes=timeout_min))


def all_reduce_max(value: int) -> int:
    """The maximum of ``value`` over all ranks."""
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.long)
    if torch.cuda.is_available():
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
