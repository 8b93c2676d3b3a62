"""torch.distributed / DeepSpeed set-up inside one worker process.

Each DeepSpeed worker is a Ray actor; before DeepSpeed is imported it needs
the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...), otherwise
DeepSpeed looks for MPI. On CPU machines the accelerator is forced to ``cpu``,
the backend is gloo, and DeepSpeed's shared-memory comm op (a ~3 minute
compile on first use) is skipped. See shared/NOTES-cpu.md.
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from typing import Any

import torch


def find_free_port() -> int:
    """A TCP port free on this host right now (fresh per worker group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
