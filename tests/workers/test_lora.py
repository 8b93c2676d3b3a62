"""LoRA on the DeepSpeed workers: only the adapters train (under every ZeRO stage and dp size
the update is one plain PEFT + torch AdamW step), the reference is the policy with its
adapters off, checkpoints hold the adapters only, and both engines serve the synced adapter.
"""

from __future__ import annotations

import pytest
import torch
from lora_adapters import assert_merged_as_served  # tests/ is on sys.path
from transformers import AutoModelForCausalLM
from worker_helpers import (
    LR,
    MAX_SEQ_LEN,
    assert_weights_close,
    make_batch,
    make_config,
    row_logprobs,
)

from skyrl.algorithms.reductions import compute_loss_weights
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.config.root import LoraConfig
from skyrl.dispatch import MeshDispatch
from skyrl.inference.base import SamplingParams
from skyrl.inference.hf import HFEngine
from skyrl.inference.local import generate_batch
from skyrl.models.lora import add_adapters, is_adapter_name, param_name, wire_name
from skyrl.trainer.weight_sync import BroadcastWeightSync, SharedMemoryWeightSync
from skyrl.workers.group import WorkerGroup

pytestmark = pytest.mark.slow

ROWS = [16, 9, 13, 6]


def lora_config(model_path: str, **trainer):
    cfg = make_config(model_path, **trainer)
    cfg.model.lora = LoraConfig(rank=4, alpha=8)
    return cfg


def stage(batch: TrainingInputBatch, dp_size: int):
    uids = batch.metadata["uids"]
    bounds = compute_prompt_mini_batch_boundaries(uids, len(set(uids)), len(set(uids)))
    return MeshDispatch.stage_chunks(
        dp_size,
        batch,
        bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )


def peft_reference(model_path: str, adapter: dict, batch: TrainingInputBatch, steps: int):
    """The same steps on one process: base + PEFT adapters (loaded from ``adapter``), torch
    AdamW over the adapter parameters only, the ppo loss on padded rows."""
    from skyrl.algorithms import POLICY_LOSSES
    from skyrl.config.algorithm import AlgorithmConfig

    model = add_adapters(
        AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), LoraConfig(4, 8)
    )
    params = dict(model.named_parameters())
    with torch.no_grad():
        for wire, tensor in adapter.items():
            params[param_name(wire)].copy_(tensor)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert all(is_adapter_name(n) for n, p in model.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trainable, lr=LR, eps=1.0, weight_decay=0.0)
    weights = compute_loss_weights(
        "token_mean", batch.loss_mask, batch.metadata["uids"], MAX_SEQ_LEN
    )
    for _ in range(steps):
        loss, _ = POLICY_LOSSES.get("ppo")(
            row_logprobs(model, batch),
            batch.old_logprobs,
            batch.advantages,
            weights,
            batch.loss_mask,
            AlgorithmConfig(),
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def batch(tiny_model_path):
    return make_batch(tiny_model_path, ["a", "a", "b", "b"], ROWS)


@pytest.fixture(scope="module")
def trained(ray_cluster, tiny_model_path, batch, tmp_path_factory):
    """dp 2, ZeRO-0 LoRA policy after two steps (adapters A and B both moved); its initial
    checkpoint and adapter."""
    group = WorkerGroup("policy", lora_config(tiny_model_path), total_optimizer_steps=10)
    init_dir = tmp_path_factory.mktemp("lora_init")
    group.run("save_checkpoint", str(init_dir))
    initial = group.run("state_dict_for_sync")[0]
    for _ in range(2):
        group.train_mini_batch(stage(batch, 2)[0])
    yield group, str(init_dir), initial
    group.shutdown()


@pytest.mark.parametrize(
    ("dp_size", "zero_stage", "checkpointing"),
    [(1, 0, False), (2, 0, False), (2, 2, False), (2, 3, False), (2, 0, True)],
)
def test_adapter_update_is_one_plain_peft_step_whatever_the_layout(
    ray_cluster, tiny_model_path, batch, dp_size, zero_stage, checkpointing
):
    cfg = lora_config(
        tiny_model_path,
        dp_size=dp_size,
        zero_stage=zero_stage,
        gradient_checkpointing=str(checkpointing).lower(),
    )
    group = WorkerGroup("policy", cfg, total_optimizer_steps=10)
    try:
        initial = group.run("state_dict_for_sync")[0]
        assert initial and all(is_adapter_name(name) for name in initial)  # adapter sync
        assert all(not t.any() for name, t in initial.items() if ".lora_B." in name)  # B = 0
        for _ in range(2):  # step 1 moves only B (A's gradient is 0 while B = 0), step 2 both
            group.train_mini_batch(stage(batch, dp_size)[0])
        expected = peft_reference(tiny_model_path, initial, batch, steps=2)
        synced = group.run("state_dict_for_sync")
        assert all(s is None for s in synced[1:])
        reference = {
            name: p.detach() for name, p in expected.named_parameters() if is_adapter_name(name)
        }
        assert_weights_close(synced[0], {wire_name(n): t for n, t in reference.items()}, atol=1e-5)
        assert all((synced[0][n] != initial[n]).any() for n in initial)  # A and B both moved
        # the base stayed frozen: the merged view minus the adapters' delta is the base model
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        merged = group.run("state_dict_for_sync", False, "merged")[0]
        plain = dict(base.named_parameters())
        assert merged.keys() == plain.keys()
        merged_ref = expected.merge_and_unload()
        assert_weights_close(merged, dict(merged_ref.named_parameters()), atol=1e-5)
        # Adam moments for the adapters only (fp32: 2 x 4 bytes per adapter weight), on every
        # rank at ZeRO-0, partitioned over the ranks above
        moments = 8 * sum(t.numel() for t in initial.values())
        per_rank = group.run("optimizer_state_bytes")
        if zero_stage == 0:
            assert per_rank == [moments] * dp_size
        else:
            assert moments <= sum(per_rank) <= moments + 8 * 64 * dp_size  # partition padding
    finally:
        group.shutdown()


def test_reference_is_the_policy_with_adapters_off(trained, ray_cluster, tiny_model_path, batch):
    group, _, _ = trained
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], 2, 2)
    staged = MeshDispatch.stage_chunks(2, batch, bounds)
    off = group.forward(staged, len(batch), method="reference_forward")
    on = group.forward(staged, len(batch))
    reference = WorkerGroup("reference", make_config(tiny_model_path), total_optimizer_steps=10)
    try:
        separate = reference.forward(staged, len(batch))
    finally:
        reference.shutdown()
    assert torch.equal(off, separate)  # same packing, same kernels: bit for bit
    mask = batch.loss_mask.bool()
    assert (on - off)[mask].abs().max() > 1e-3  # the trained adapters do change the policy


def test_checkpoint_holds_adapters_only_and_resume_gives_the_next_step(trained, batch, tmp_path):
    group, init_dir, _ = trained
    group.run("save_checkpoint", str(tmp_path))
    states = torch.load(
        tmp_path / "policy" / "state" / "mp_rank_00_model_states.pt", weights_only=False
    )
    assert states["module"] and all(is_adapter_name(name) for name in states["module"])
    group.train_mini_batch(stage(batch, 2)[0])
    uninterrupted = group.run("state_dict_for_sync")[0]
    group.run("load_checkpoint", init_dir)  # scramble, then resume
    group.run("load_checkpoint", str(tmp_path))
    group.train_mini_batch(stage(batch, 2)[0])
    assert_weights_close(group.run("state_dict_for_sync")[0], uninterrupted, atol=0.0)
    group.run("load_checkpoint", str(tmp_path))  # back to the fixture's state


def trainer_logprobs(group: WorkerGroup, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The policy workers' logprobs of ``tokens`` after ``prompt`` (one sequence)."""
    ids = torch.tensor([prompt + tokens])
    mask = torch.ones_like(ids)
    loss_mask = torch.zeros(1, ids.shape[1])
    loss_mask[0, len(prompt) :] = 1
    row = TrainingInputBatch(
        {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask},
        {"uids": ["p"], "is_last_step": [True]},
    )
    staged = MeshDispatch.stage_chunks(2, row, [(0, 1)])
    return group.forward(staged, 1)[0, len(prompt) :]


def engine_matches_trainer(engine, group: WorkerGroup) -> float:
    """Greedy tokens from ``engine``; the worst gap between its logprobs and the trainer's."""
    prompt = [5, 6, 7, 8, 9]
    [[out]] = generate_batch(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=8))
    trainer = trainer_logprobs(group, prompt, out.token_ids)
    return float((trainer - torch.tensor(out.logprobs)).abs().max())


@pytest.mark.parametrize("path", ["object_store", "shared_memory", "broadcast"])
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_engine_serves_the_synced_adapter(trained, tiny_model_path, backend, path):
    import dataclasses

    group, _, _ = trained
    lora = dataclasses.asdict(LoraConfig(4, 8))
    if backend == "hf":
        engine = HFEngine(tiny_model_path, lora=lora)
    else:
        from skyrl.inference.vllm_engine import VLLMEngine

        engine = VLLMEngine(
            tiny_model_path, kv_cache_memory_bytes=16 << 20, max_model_len=128, lora=lora
        )
    try:
        before = engine_matches_trainer(engine, group)  # engine still serves the base model
        if path == "object_store":
            engine.update_weights(group.stream_weight_buckets(1 << 20))
        elif path == "shared_memory":
            shared = SharedMemoryWeightSync(group, lora_config(tiny_model_path))
            engine.update_weights(shared.stage())
            shared.close()
        else:
            cfg = lora_config(tiny_model_path, weight_sync="broadcast")
            BroadcastWeightSync(group, engine, cfg).sync()
        after = engine_matches_trainer(engine, group)
        assert after <= 1e-4, f"engine logprobs {after:.3g} off the trainer's under the adapter"
        assert before > 1e-2, f"the base model is only {before:.3g} off: adapter too weak"
    finally:
        engine.shutdown()


def test_export_writes_a_merged_model_and_a_peft_adapter(trained, tiny_model_path, tmp_path):
    group, _, _ = trained
    merged_dir, adapter_dir = tmp_path / "final_hf", tmp_path / "final_adapter"
    group.run("export_hf", str(merged_dir), tiny_model_path, str(adapter_dir))
    peft_model = assert_merged_as_served(merged_dir, tiny_model_path, adapter_dir)
    # and the merged model generates what an engine serving the adapter generates
    engine = HFEngine(str(merged_dir))
    try:
        prompt = [5, 6, 7, 8, 9]
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        [[out]] = generate_batch(engine, [prompt], greedy)
        tokens = peft_model.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None
        )[0, len(prompt) :].tolist()
        assert out.token_ids == tokens[: len(out.token_ids)]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_a_tied_model_checkpoint_holds_adapters_only_and_exports_the_trained_model(
    ray_cluster, tmp_path, stored
):
    # SmolLM2 (the default model) ties lm_head to the embedding: the frozen weight has two
    # names and only one was dropped from the checkpoint, which skyrl-eval then refused;
    # a bf16-stored base was merged in bf16, losing most of a small update
    from skyrl.models.tiny import build_tiny_model
    from skyrl.trainer.checkpoint import export_checkpoint_hf, policy_state_dict

    base = str(tmp_path / "base")
    build_tiny_model(base, tie_word_embeddings=True)
    AutoModelForCausalLM.from_pretrained(base, dtype=stored).save_pretrained(base)
    rows = make_batch(base, ["a", "a", "b", "b"], ROWS)
    group = WorkerGroup("policy", lora_config(base, dp_size=1), total_optimizer_steps=10)
    try:
        group.train_mini_batch(stage(rows, 1)[0])
        group.run("save_checkpoint", str(tmp_path / "ckpt"))
        group.run("export_hf", str(tmp_path / "final_hf"), base)
    finally:
        group.shutdown()
    states = policy_state_dict(tmp_path / "ckpt")
    assert states and all(is_adapter_name(name) for name in states), sorted(states)[:3]
    exported = export_checkpoint_hf(tmp_path / "ckpt", base, base, tmp_path / "exported")
    reloaded = AutoModelForCausalLM.from_pretrained(exported)
    trained = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "final_hf").named_parameters())
    for name, param in reloaded.named_parameters():
        assert param.dtype == torch.float32, name
        torch.testing.assert_close(param, trained[name], atol=1e-6, rtol=0)
