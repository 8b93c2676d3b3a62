"""A sender process for weight-sync tests: joins the broadcast group as rank 0 and sends
saved tensors bucket by bucket, as policy rank 0 does in a run."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

SENDER = """
import json, sys, torch
from skyrl.inference.weight_sync import join_group, send_bucket
weights_file, port, world_size, plan = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
backend, device = sys.argv[5], torch.device(sys.argv[6])
if device.type == "cuda":
    torch.cuda.set_device(device)
weights = {name: t.to(device) for name, t in torch.load(weights_file).items()}
group = join_group("127.0.0.1", port, 0, world_size, backend, timeout_s=60)
for bucket in plan:
    send_bucket(group, bucket, [weights[name] for name, _, _ in bucket])
if device.type == "cuda":
    torch.cuda.synchronize()
# Exit without running the group's destructor: once seen to end the process with
# "terminate called without an active exception" (exit code != 0) under load.
import os
os._exit(0)
"""


def start_sender(
    tmp_path,
    weights: dict[str, torch.Tensor],
    plan,
    port: int,
    world_size: int,
    backend: str = "gloo",
    device: str = "cpu",
):
    """A separate process that joins as rank 0 and broadcasts ``weights`` (moved to
    ``device``) per ``plan``."""
    weights_file = tmp_path / "weights.pt"
    torch.save(weights, weights_file)
    args = [str(weights_file), str(port), str(world_size), json.dumps(plan), backend, device]
    return subprocess.Popen(
        [sys.executable, "-c", SENDER, *args], stderr=subprocess.PIPE, text=True
    )


def finish(sender) -> None:
    _, err = sender.communicate(timeout=120)
    assert sender.returncode == 0, err[-2000:]
