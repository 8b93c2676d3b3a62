"""The shared-memory weight file: layout, another process's writes read back bit for bit, the
name unlinked while mapped, clear errors, stale files swept (only this user's that no process
holds), and engines (in-process and in a Ray actor) loading from the handle."""

from __future__ import annotations

import fcntl
import math
import multiprocessing
import os
import pickle
import subprocess
import sys
from pathlib import Path

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


NO_SUCH_PID = 2**22 + 1
"""Above the kernel's largest pid (2**22 on 64-bit): dead in every pid namespace, as the pid
in the name of a file made in another container (docker --ipc=host shares /dev/shm) is here."""


def test_sweep_leaves_a_file_someone_holds_whatever_pid_its_name_carries(tmp_path):
    held = tmp_path / f"{PREFIX}{NO_SUCH_PID}-abcd1234"  # a live run in another container
    left = tmp_path / f"{PREFIX}{NO_SUCH_PID}-dead0000"  # a dead run's leftover
    other = tmp_path / "unrelated-file"
    for path in (held, left, other):
        path.write_bytes(b"x")
    fd = os.open(held, os.O_RDONLY)  # its own open file description: flock locks are per one
    fcntl.flock(fd, fcntl.LOCK_SH)  # as create_shared_weights holds it
    try:
        assert sweep_stale(tmp_path) == [left]
        assert held.exists() and not left.exists() and other.exists()
    finally:
        os.close(fd)
    assert sweep_stale(tmp_path) == [held]  # nobody holds it any more


def test_a_file_is_swept_once_the_process_that_made_it_is_gone(tmp_path):
    maker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; import torch\n"
            "from skyrl.inference.shared_weights import create_shared_weights\n"
            "from skyrl.inference.weight_sync import plan_buckets, tensor_spec\n"
            "plan = plan_buckets([tensor_spec('w', [4], torch.float32)], 256)\n"
            "print(create_shared_weights(plan, Path(sys.argv[1])).path, flush=True)\n"
            "sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        path = Path(maker.stdout.readline().strip())
        assert path.parent == tmp_path and path.stat().st_size == 16  # 4 float32
        assert sweep_stale(tmp_path) == [] and path.exists()  # its maker runs
        mine = handle_for({"w": torch.zeros(4)}, tmp_path)  # its sweep leaves it too
        assert path.exists() and sweep_stale(tmp_path) == []
    finally:
        maker.kill()
        maker.wait(60)
    assert sweep_stale(tmp_path) == [path]  # killed: its lock went with it
    mine.release()


def test_sweep_leaves_other_users_files(tmp_path, monkeypatch):
    stale = tmp_path / f"{PREFIX}{NO_SUCH_PID}-abcd1234"
    stale.write_bytes(b"x")
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)  # the file is now someone else's
    assert sweep_stale(tmp_path) == [] and stale.exists()


def test_a_stale_file_that_cannot_be_removed_does_not_stop_a_run(tmp_path, monkeypatch):
    """/dev/shm is sticky (1777): only a file's owner may remove it."""
    stale = tmp_path / f"{PREFIX}{NO_SUCH_PID}-abcd1234"
    stale.write_bytes(b"x")
    unlink = os.unlink

    def refuse(path, *args, **kwargs):
        if Path(path) == stale:
            raise PermissionError(1, "Operation not permitted", str(path))
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    handle = handle_for({"w": torch.zeros(4)}, tmp_path)
    assert stale.exists() and os.stat(handle.path).st_size == 16  # 4 float32
    handle.release()


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


def test_the_files_memory_is_taken_when_it_is_made():
    """Two runs on one machine: each measures /dev/shm's room before making its file, so a
    file must take its memory at once (a sparse file takes none until rank 0 writes, and
    the second run's write past the room would die of SIGBUS instead of a clear error)."""
    plan = plan_buckets([tensor_spec("w", [1000, 1000], torch.float32)], 1 << 20)
    handle = create_shared_weights(plan, SHM_DIR)  # 1000 * 1000 * 4 = 4,000,000 bytes
    try:
        assert os.stat(handle.path).st_blocks * 512 >= 4_000_000
    finally:
        handle.release()
