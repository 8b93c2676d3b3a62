"""The broadcast weight sync over NCCL (``make test-gpu``): a sender process on GPU 0
broadcasts seed-1 weights into an hf engine on GPU 1. NCCL cannot put two ranks on one
GPU, so on a one-GPU machine this test is reported as skipped with that reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl.inference.weight_sync import plan_buckets, tensor_spec
from skyrl.models import build_tiny_model
from skyrl.workers.distributed import find_free_port

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).parents[1] / "inference"))  # sync_sender


def test_nccl_broadcast_into_an_hf_engine_on_another_gpu(tmp_path):
    from sync_sender import finish, start_sender

    from skyrl.inference.hf import HFEngine

    assert torch.cuda.is_available(), "gpu tests need an NVIDIA GPU (run them with make test-gpu)"
    if torch.cuda.device_count() < 2:
        pytest.skip(f"NCCL needs one GPU per rank: 2 wanted, {torch.cuda.device_count()} here")
    torch.cuda.set_device(1)
    engine = HFEngine(build_tiny_model(), device="cuda:1")
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    weights = {n: p.detach().clone() for n, p in other.named_parameters()}
    plan = plan_buckets((tensor_spec(n, t.shape, t.dtype) for n, t in weights.items()), 64 << 10)
    port = find_free_port()
    sender = start_sender(tmp_path, weights, plan, port, 2, backend="nccl", device="cuda:0")
    engine.join_weight_sync("127.0.0.1", port, 1, 2, "nccl")
    engine.receive_weights(plan)
    finish(sender)
    for name, param in engine.model.named_parameters():
        assert torch.equal(param.cpu(), weights[name]), name
