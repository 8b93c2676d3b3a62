"""The broadcast weight-sync group: bucket plans, byte layout, and real gloo round trips
from a sender process into plain tensors and into the hf engine."""

from __future__ import annotations

import pytest
import torch
from sync_sender import finish, start_sender
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import generate_batch
from skyrl.inference.weight_sync import (
    bucket_offsets,
    join_group,
    plan_buckets,
    receive_stream,
    send_bucket,
    tensor_spec,
)
from skyrl.models import build_tiny_model
from skyrl.workers.distributed import find_free_port


def test_plan_buckets_cut_by_size_in_order():
    # fp32 tensors of 10, 10, 25 and 4 elements = 40, 40, 100 and 16 bytes; budget 80:
    # a + b = 80 fits; c alone exceeds the budget and gets its own bucket; d starts a new one
    specs = [
        tensor_spec(n, [k], torch.float32) for n, k in (("a", 10), ("b", 10), ("c", 25), ("d", 4))
    ]
    plan = plan_buckets(specs, 80)
    assert [[s[0] for s in bucket] for bucket in plan] == [["a", "b"], ["c"], ["d"]]
    assert plan[0][0] == ("a", [10], "float32")


def test_entries_start_on_16_byte_boundaries():
    # bf16 x 3 = 6 bytes -> next entry at 16; fp32 x 10 = 40 bytes -> ends at 56, rounded to 64;
    # int64 scalar = 8 bytes -> total 64 + 16 = 80
    bucket = [
        tensor_spec("x", [3], torch.bfloat16),
        tensor_spec("y", [2, 5], torch.float32),
        tensor_spec("z", [], torch.int64),
    ]
    assert bucket_offsets(bucket) == ([0, 16, 64], 80)


def test_send_rejects_a_tensor_that_does_not_match_the_plan():
    bucket = [tensor_spec("w", [2, 3], torch.float32)]
    with pytest.raises(ValueError, match=r"w is \[3, 2\] torch.float32, the plan says \[2, 3\]"):
        send_bucket(None, bucket, [torch.zeros(3, 2)])


def test_round_trip_of_mixed_dtypes_and_a_tensor_larger_than_a_bucket(tmp_path):
    gen = torch.Generator().manual_seed(0)
    weights = {
        "emb": torch.randn(7, 5, generator=gen),
        "norm": torch.randn(3, generator=gen).to(torch.bfloat16),
        "step": torch.tensor(42, dtype=torch.int64),
        "big": torch.randn(1000, generator=gen),  # 4000 bytes > the 256-byte budget
        "bias": torch.randn(2, generator=gen, dtype=torch.float64),
    }
    plan = plan_buckets((tensor_spec(n, t.shape, t.dtype) for n, t in weights.items()), 256)
    assert len(plan) == 3  # [emb, norm, step], [big], [bias]
    port = find_free_port()
    sender = start_sender(tmp_path, weights, plan, port, world_size=2)
    group = join_group("127.0.0.1", port, 1, 2, "gloo", timeout_s=60)
    received = dict(receive_stream(group, plan, "cpu"))
    finish(sender)
    assert received.keys() == weights.keys()
    for name, tensor in weights.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


def forward_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_hf_engines_behind_a_client_receive_new_weights(tmp_path, ray_cluster):
    """An in-process engine (rank 1) and a Ray-actor engine (rank 2) get seed-1 weights
    broadcast into their seed-0 models."""
    from skyrl.inference.client import EngineClient, RayEngineHandle
    from skyrl.inference.hf import HFEngine

    local = HFEngine(build_tiny_model())
    actor = RayEngineHandle.start(HFEngine, {"model_path": build_tiny_model()})
    client = EngineClient([local, actor])
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    weights = {n: p.detach().clone() for n, p in other.named_parameters()}
    plan = plan_buckets((tensor_spec(n, t.shape, t.dtype) for n, t in weights.items()), 64 << 10)
    assert len(plan) > 1
    before = dict(local.model.named_parameters())["model.embed_tokens.weight"].clone()
    assert not torch.equal(before, weights["model.embed_tokens.weight"])

    port = find_free_port()
    sender = start_sender(tmp_path, weights, plan, port, world_size=3)
    client.join_weight_sync("127.0.0.1", port, 1, 3, "gloo")
    client.receive_weights(plan)
    finish(sender)
    for name, param in local.model.named_parameters():
        assert torch.equal(param, weights[name]), name
    prompt = AutoTokenizer.from_pretrained(build_tiny_model()).encode("What is 12 + 7?")
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    for engine in (local, actor):
        [[c]] = generate_batch(engine, [prompt], greedy)
        expected = forward_logprobs(other, prompt, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    client.shutdown()
