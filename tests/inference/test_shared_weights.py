"""The shared-memory weight file: layout, another process's writes read back bit for bit, the
name unlinked while mapped, clear errors, stale files swept, and engines (in-process and in
a Ray actor) loading from the handle."""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.inference.base import SamplingParams
from skyrl.inference.hf import HFEngine
from skyrl.inference.local import generate_batch
from skyrl.inference.shared_weights import (
    PREFIX,
    SHM_DIR,
    SharedWeights,
    SharedWeightsMissing,
    create_shared_weights,
    sweep_stale,
)
from skyrl.inference.weight_sync import plan_buckets, tensor_spec
from skyrl.models import build_tiny_model


def mixed_weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "emb": torch.randn(7, 5, generator=gen),
        "norm": torch.randn(3, generator=gen).to(torch.bfloat16),
        "step": torch.tensor(42, dtype=torch.int64),
        "big": torch.randn(1000, generator=gen),  # 4000 bytes > the 256-byte bucket budget
        "bias": torch.randn(2, generator=gen, dtype=torch.float64),
    }


def handle_for(weights: dict[str, torch.Tensor], directory) -> SharedWeights:
    specs = [tensor_spec(n, t.shape, t.dtype) for n, t in weights.items()]
    return create_shared_weights(plan_buckets(specs, 256), directory)


def _write_in_child(handle: SharedWeights, weights: dict[str, torch.Tensor]) -> None:
    handle.write(0, list(weights.values()))


def test_layout_is_the_plans_buckets_back_to_back_on_16_byte_boundaries(tmp_path):
    # plan at 256 bytes: [emb (140 B), norm (6 B), step (8 B)], [big (4000 B)], [bias (16 B)]
    # bucket 1: emb 0..140 -> 144, norm 144..150 -> 160, step 160..168 -> 176 = 176 bytes
    # bucket 2 starts at 176: big 176..4176 = 4000 bytes; bucket 3 at 4176: bias, 16 bytes
    handle = handle_for(mixed_weights(), tmp_path)
    assert handle.offsets == (0, 144, 160, 176, 4176)
    assert handle.nbytes == 4192 == os.stat(handle.path).st_size
    assert os.path.basename(handle.path).startswith(f"{PREFIX}{os.getpid()}-")
    handle.release()


def test_another_process_writes_and_this_one_reads_bit_for_bit(tmp_path):
    weights = mixed_weights()
    handle = handle_for(weights, tmp_path)
    child = multiprocessing.get_context("spawn").Process(
        target=_write_in_child, args=(handle, weights)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    got = dict(handle)
    assert list(got) == list(weights)
    for name, tensor in weights.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    handle.release()
    assert not os.path.exists(handle.path)


def test_write_rejects_a_tensor_that_does_not_match_the_plan(tmp_path):
    handle = handle_for({"w": torch.zeros(2, 3)}, tmp_path)
    with pytest.raises(ValueError, match=r"w is \[3, 2\] torch.float32, the plan says \[2, 3\]"):
        handle.write(0, [torch.zeros(3, 2)])
    handle.release()


def test_the_memory_outlives_the_name_while_mapped(tmp_path):
    handle = handle_for({"w": torch.zeros(4)}, tmp_path)
    views = dict(handle)  # maps the file
    handle.unlink()
    assert not os.path.exists(handle.path)
    handle.write(0, [torch.arange(4.0)])  # through this process's mapping
    assert views["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert dict(handle)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    handle.release()


def test_a_process_without_the_file_gets_one_line_naming_it(tmp_path):
    handle = handle_for({"w": torch.zeros(4)}, tmp_path)
    handle.unlink()  # as on another machine: the name is not there and nothing mapped it
    with pytest.raises(SharedWeightsMissing, match="trainer.weight_sync=shared_memory") as e:
        dict(handle)
    assert handle.path in str(e.value) and "\n" not in str(e.value)


def test_the_handle_pickles_small_whatever_the_weights(tmp_path):
    handle = handle_for({"w": torch.zeros(1 << 20)}, tmp_path)  # 4 MiB of weights
    assert handle.nbytes == 4 << 20
    assert len(pickle.dumps(handle)) < 1024
    handle.release()


def test_sweep_removes_the_files_of_dead_drivers_only(tmp_path):
    child = multiprocessing.get_context("spawn").Process(target=os.getpid)
    child.start()
    child.join(60)
    dead = tmp_path / f"{PREFIX}{child.pid}-abcd1234"
    mine = tmp_path / f"{PREFIX}{os.getpid()}-abcd1234"
    other = tmp_path / "unrelated-file"
    for path in (dead, mine, other):
        path.write_bytes(b"x")
    assert sweep_stale(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and other.exists()


@pytest.fixture(scope="module")
def tiny():
    path = build_tiny_model()
    return path, AutoTokenizer.from_pretrained(path).encode("What is 12 + 7?")


def test_hf_engine_loads_from_the_handle(tiny, tmp_path):
    path, prompt = tiny
    engine = HFEngine(path)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    weights = {n: p.detach() for n, p in other.named_parameters()}
    handle = handle_for(weights, tmp_path)
    handle.write(0, list(weights.values()))
    engine.update_weights(handle)
    [[c]] = generate_batch(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=8))
    with torch.no_grad():
        logits = other(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    handle.release()
    engine.shutdown()


def test_an_engine_in_a_ray_actor_maps_the_file_itself(ray_cluster, tiny, tmp_path):
    """Only the handle crosses Ray: the actor maps the file and loads from it. An all-zero
    output layer gives logits 0, so every token's logprob is -ln(vocab size) exactly."""
    from skyrl.inference.client import RayEngineHandle

    path, prompt = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    zeros = {"lm_head.weight": torch.zeros_like(model.lm_head.weight)}
    handle = handle_for(zeros, SHM_DIR)  # a path every process on this machine sees
    handle.write(0, list(zeros.values()))
    engine = RayEngineHandle.start(HFEngine, {"model_path": path}, num_cpus=0.1)
    try:
        engine.update_weights(handle)
        [[c]] = generate_batch(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=4))
        vocab = model.lm_head.weight.shape[0]
        assert c.logprobs == pytest.approx([-math.log(vocab)] * len(c.token_ids), abs=1e-5)
    finally:
        engine.shutdown()
        handle.release()
